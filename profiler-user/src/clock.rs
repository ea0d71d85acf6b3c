//! The clock of the kernel programs' timestamps (`bpf_ktime_get_ns`).

/// CLOCK_MONOTONIC now, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_MONOTONIC always
    // exists, so clock_gettime only writes `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A clock's reading in ns (`CLOCK_BOOTTIME`, `CLOCK_REALTIME`, ...).
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; an unknown clock only
    // makes clock_gettime fail, leaving it zero.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// How far CLOCK_BOOTTIME is ahead of CLOCK_MONOTONIC: the time the
/// system spent suspended since boot. It grows only across a suspend.
pub fn suspended_ns() -> u64 {
    let mono = monotonic_ns();
    clock_ns(libc::CLOCK_BOOTTIME).saturating_sub(mono)
}

/// The wall clock (Unix time, ns) of CLOCK_MONOTONIC reading `mono_ns`.
pub fn unix_of_monotonic(mono_ns: u64) -> u64 {
    let (now_mono, now_unix) = (monotonic_ns(), clock_ns(libc::CLOCK_REALTIME));
    (now_unix + mono_ns).saturating_sub(now_mono)
}

/// Unix time `unix_ns` as RFC 3339 in UTC, to the microsecond:
/// `2026-12-01T21:50:45.123456Z`.
pub fn rfc3339(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let micros = (unix_ns % 1_000_000_000) / 1_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        // 2026-12-01 21:50:45.123456 UTC.
        assert_eq!(
            rfc3339(1_796_161_845_123_456_789),
            "2026-12-01T21:50:45.123456Z"
        );
        // A leap day.
        assert_eq!(
            rfc3339(951_782_400_000_000_000),
            "2000-02-29T00:00:00.000000Z"
        );
    }

    #[test]
    fn the_system_has_not_been_suspended_backwards() {
        let a = suspended_ns();
        assert!(suspended_ns() + 1_000_000 >= a);
    }

    #[test]
    fn monotonic_clock_advances() {
        let a = monotonic_ns();
        assert!(monotonic_ns() >= a && a > 0);
    }
}
