//! The running kernel's release and version, for the layers that choose
//! by it (`attach/kernel.rs` has what each release added).

/// 5-byte-nop uprobes are turned into calls (no trap) from this release.
pub const NOP5_CALLS: (u32, u32) = (6, 18);

/// The running kernel's release (`uname -r`), e.g. `6.1.0-50-amd64`.
pub fn release() -> String {
    // SAFETY: uname fills the zeroed struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::from("unknown");
    }
    // SAFETY: uname NUL-terminates `release`.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// `(major, minor)` of a release such as `6.12.117+deb12-amd64`.
pub fn version_of(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether the running kernel is `at` or later (true when its release
/// cannot be read: the load then says what is missing).
pub fn at_least(at: (u32, u32)) -> bool {
    version_of(&release()).is_none_or(|v| v >= at)
}
