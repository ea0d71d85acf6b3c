//! `profiler watch`: checks the arguments, then watches until stopped
//! ([`crate::session::watch`]).
use crate::{cli::WatchArgs, tracee::caps, Error, Result};

/// The smallest `--max-disk`: a few reports and a rotated `stalls.jsonl`.
const MIN_DISK: u64 = 256 * 1024;

/// Runs `profiler watch`.
pub fn run(args: &WatchArgs) -> Result<()> {
    crate::heap::tune();
    if args.max_disk < MIN_DISK {
        return Err(Error::Usage(format!(
            "--max-disk {} is too small to hold a report: give at least 256K",
            args.max_disk
        )));
    }
    if args.dispatch.threshold.is_zero() {
        return Err(Error::Usage(
            "--threshold 0 would make every iteration a stall: give e.g. 100ms".into(),
        ));
    }
    if args.keep.is_zero() || args.keep > std::time::Duration::from_secs(600) {
        return Err(Error::Usage(
            "--keep is how far back the flight recorder keeps samples: give 1s to 10m".into(),
        ));
    }
    if args.max_reports_per_hour == 0 {
        return Err(Error::Usage(
            "--max-reports-per-hour 0 would report nothing: give at least 1 (every stall is still a line)"
                .into(),
        ));
    }
    if let Some(every) = args.profile_every {
        if every < std::time::Duration::from_secs(1)
            || every > std::time::Duration::from_secs(86_400)
        {
            return Err(Error::Usage(format!(
                "--profile-every {} is out of range: give 1s to 24h (e.g. 1m), one pprof per process and window",
                crate::text::fmt_ns(every.as_nanos() as u64)
            )));
        }
    }
    caps::check()?;
    crate::attach::kernel::restore_left_expedited();
    crate::session::watch::run(args)
}
