//! Checks the capabilities tracing needs, so a missing one is named up
//! front instead of surfacing as an EPERM from deep inside a syscall.

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Parses `CapEff:` from the text of `/proc/self/status`.
fn effective_caps(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
}

/// Names of the capabilities tracing needs that `caps` lacks.
fn missing_from(caps: u64) -> Vec<&'static str> {
    [
        (CAP_BPF, "CAP_BPF"),
        (CAP_PERFMON, "CAP_PERFMON"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    ]
    .into_iter()
    .filter(|(bit, _)| caps & (1u64 << bit) == 0)
    .map(|(_, name)| name)
    .collect()
}

/// Fails with [`crate::Error::MissingCapability`] unless this process has
/// CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN in its effective set.
pub fn check() -> crate::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| crate::Error::io("reading /proc/self/status", e))?;
    let caps = effective_caps(&status).unwrap_or(0);
    let missing = missing_from(caps);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(crate::Error::MissingCapability {
            missing: missing.join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_names_missing() {
        let status = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        assert_eq!(
            missing_from(effective_caps(status).unwrap()),
            Vec::<&str>::new()
        );
        let no_admin = 0x1ff_ffff_ffffu64 & !(1 << CAP_SYS_ADMIN);
        assert_eq!(missing_from(no_admin), vec!["CAP_SYS_ADMIN"]);
        assert_eq!(
            missing_from(0),
            vec!["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN"]
        );
    }
}
