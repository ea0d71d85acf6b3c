//! `profiler watch` as a service, in the `.deb` (issue 43): two systemd
//! units, their defaults file and a logrotate snippet, as text the package
//! writes (`deb.rs`) and the tests below verify with `systemd-analyze
//! verify` and `logrotate -d`.
//!
//! - `profiler-watch@.service`: one instance per unit to watch,
//!   `profiler-watch@redis-server.service` runs `profiler watch --unit
//!   redis-server.service --out /var/lib/profiler/watch/redis-server`;
//! - `profiler-watch.service`: the targets named in
//!   `/etc/default/profiler-watch` (`PROFILER_WATCH_TARGETS`), into
//!   `/var/lib/profiler/watch/default`;
//! - `/etc/default/profiler-watch`: `PROFILER_WATCH_ARGS`, options for
//!   both, and `PROFILER_WATCH_TARGETS`;
//! - `/etc/logrotate.d/profiler-watch`: `stalls.jsonl` rotated, the
//!   watchers told by SIGHUP (`systemctl reload`), which makes them reopen
//!   their files: no line is lost, as `copytruncate` would lose the lines
//!   written between its copy and its truncation.
//!
//! Both run as root with the capabilities tracing needs and no others
//! ([`CAPABILITIES`]), under the hardening that still lets it trace
//! ([`HARDENING`]); docs/watch-ops.md explains each.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::util::find_program;

/// Where the units go in a Debian 12 package (`/lib`, not `/usr/lib`,
/// until the /usr-merge's moves: DEP 17).
pub const UNIT_DIR: &str = "lib/systemd/system";

/// The instance unit's file name.
pub const TEMPLATE: &str = "profiler-watch@.service";

/// The configured unit's file name.
pub const CONFIGURED: &str = "profiler-watch.service";

/// The defaults file, a conffile.
pub const DEFAULTS: &str = "etc/default/profiler-watch";

/// The logrotate snippet, a conffile.
pub const LOGROTATE: &str = "etc/logrotate.d/profiler-watch";

/// The capabilities the service keeps, with why (the comment block in the
/// unit says the same).
pub const CAPABILITIES: &[(&str, &str)] = &[
    ("CAP_BPF", "loading the eBPF programs and maps"),
    (
        "CAP_PERFMON",
        "the samplers' perf events and the tracing programs",
    ),
    (
        "CAP_SYS_ADMIN",
        "uprobes attached as perf events (6.x kernels with the CVE-2025-38466 fix ask \
         for it); without it the profiler refuses to start, naming it",
    ),
    (
        "CAP_SYS_PTRACE",
        "/proc/PID/exe, maps, mem and root of another user's process; without it \
         `reading /proc/PID/exe: Permission denied` before anything is attached",
    ),
    (
        "CAP_DAC_READ_SEARCH",
        "/proc/PID/map_files of another user's process (a directory only its owner \
         may search), from which the unwind tables are built; without it 0% complete \
         stacks and no Python frames",
    ),
    (
        "CAP_SYSLOG",
        "kernel frames' names from /proc/kallsyms where kernel.kptr_restrict is 1 \
         (it shows zero addresses to others)",
    ),
];

/// The `[Service]` lines both units share after their `ExecStart`.
const HARDENING: &str = "\
# watch reopens stalls.jsonl and its other files on SIGHUP (logrotate).
ExecReload=/bin/kill -HUP $MAINPID
# SIGTERM ends it with everything flushed, exit 0.
TimeoutStopSec=30s
Restart=on-failure
RestartSec=5s
UMask=0027

# Root with only the capabilities tracing needs (docs/watch-ops.md says
# why each): CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN load the programs and
# attach uprobes (perf-event uprobes need CAP_SYS_ADMIN on 6.x kernels);
# CAP_SYS_PTRACE reads other users' /proc/PID/{exe,maps,mem,root};
# CAP_DAC_READ_SEARCH searches their /proc/PID/map_files (unwind tables);
# CAP_SYSLOG names kernel frames where kernel.kptr_restrict is 1.
CapabilityBoundingSet=@CAPABILITIES@
NoNewPrivileges=yes
# The eBPF maps are charged to the memory cgroup (kernels 5.11 and
# later); descriptors: one per probed binary, ring and CPU sampler.
LimitNOFILE=65536

ProtectSystem=strict
ProtectHome=read-only
# No PrivateTmp: JIT runtimes (node --perf-basic-prof) write the perf maps
# that name their code to /tmp/perf-PID.map.
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
SystemCallArchitectures=native
";

/// [`HARDENING`] with [`CAPABILITIES`] in its bounding set.
fn hardening() -> String {
    let caps: Vec<&str> = CAPABILITIES.iter().map(|(cap, _)| *cap).collect();
    HARDENING.replace("@CAPABILITIES@", &caps.join(" "))
}

/// `profiler-watch@.service`.
pub fn template_unit() -> String {
    let hardening = hardening();
    format!(
        "\
# profiler watch on one systemd unit: `systemctl enable --now
# profiler-watch@redis-server.service` watches redis-server.service's
# processes into /var/lib/profiler/watch/redis-server/. Options for every
# instance: /etc/default/profiler-watch (PROFILER_WATCH_ARGS); for one:
# `systemctl edit profiler-watch@NAME.service`.
[Unit]
Description=profiler watch: stalls of %i.service's main thread
Documentation=man:profiler-watch(1) file:/usr/share/doc/profiler/watch-ops.md
# Ordering only: watch picks the unit's processes up whenever they start.
After=%i.service

[Service]
Type=simple
EnvironmentFile=-/etc/default/profiler-watch
ExecStart=/usr/bin/profiler watch --unit %i.service --out /var/lib/profiler/watch/%i $PROFILER_WATCH_ARGS
StateDirectory=profiler/watch profiler/watch/%i
StateDirectoryMode=0750
{hardening}
[Install]
WantedBy=multi-user.target
"
    )
}

/// `profiler-watch.service`.
pub fn configured_unit() -> String {
    let hardening = hardening();
    format!(
        "\
# profiler watch on the targets /etc/default/profiler-watch names
# (PROFILER_WATCH_TARGETS: --pid, --exe, --unit, --cgroup), into
# /var/lib/profiler/watch/default/. For one unit alone,
# profiler-watch@UNIT.service needs no configuration.
[Unit]
Description=profiler watch: the targets named in /etc/default/profiler-watch
Documentation=man:profiler-watch(1) file:/usr/share/doc/profiler/watch-ops.md
After=network.target

[Service]
Type=simple
EnvironmentFile=/etc/default/profiler-watch
ExecStart=/usr/bin/profiler watch --out /var/lib/profiler/watch/default $PROFILER_WATCH_TARGETS $PROFILER_WATCH_ARGS
StateDirectory=profiler/watch profiler/watch/default
StateDirectoryMode=0750
{hardening}
[Install]
WantedBy=multi-user.target
"
    )
}

/// `/etc/default/profiler-watch`.
pub fn defaults() -> String {
    "\
# Options of profiler watch when it runs as a service (profiler-watch.service
# and every profiler-watch@UNIT.service). Words are split on spaces; no
# quoting. `systemctl restart` the units after a change.

# Options for every watcher, e.g.
#   PROFILER_WATCH_ARGS=\"--threshold 100ms --max-disk 200M\"
# --metrics PORT serves Prometheus metrics on 127.0.0.1:PORT (HOST:PORT to
# listen elsewhere); give it to one unit only (`systemctl edit`), since two
# watchers cannot listen on one port.
PROFILER_WATCH_ARGS=\"\"

# What profiler-watch.service watches (profiler-watch@UNIT.service watches
# UNIT), e.g.
#   PROFILER_WATCH_TARGETS=\"--exe /usr/bin/redis-server --unit nginx.service\"
PROFILER_WATCH_TARGETS=\"\"
"
    .to_owned()
}

/// `/etc/logrotate.d/profiler-watch`.
pub fn logrotate() -> String {
    "\
# stalls.jsonl of every profiler watch service. The watchers reopen their
# files on SIGHUP (systemctl reload), so a rotation loses no line.
/var/lib/profiler/watch/*/stalls.jsonl {
\tweekly
\tmaxsize 100M
\trotate 8
\tmissingok
\tnotifempty
\tcompress
\tdelaycompress
\tcreate 0640 root root
\tsharedscripts
\tpostrotate
\t\tsystemctl reload 'profiler-watch*.service' >/dev/null 2>&1 || true
\tendscript
}
"
    .to_owned()
}

/// Copies the host's own units (the targets ours depend on) into
/// `root`'s unit directory, for `systemd-analyze verify --root`; false,
/// with nothing done, where systemd-analyze or the units are missing.
pub fn host_units_into(root: &Path) -> Result<bool> {
    let host = Path::new("/").join(UNIT_DIR);
    if find_program("systemd-analyze").is_none() || !host.is_dir() {
        return Ok(false);
    }
    let units = root.join(UNIT_DIR);
    std::fs::create_dir_all(&units).with_context(|| format!("creating {}", units.display()))?;
    let ok = Command::new("cp")
        .arg("-a")
        .arg("--no-clobber")
        .arg(format!("{}/.", host.display()))
        .arg(&units)
        .status()
        .context("running cp")?;
    if !ok.success() {
        bail!("copying {} into {}", host.display(), units.display());
    }
    Ok(true)
}

/// `systemd-analyze verify --root ROOT UNIT`: whether it passed, and all
/// it said. It exits 0 on a bad value or an unknown key, only warning: a
/// clean unit is a success with nothing said.
pub fn verify(root: &Path, unit: &str) -> Result<(bool, String)> {
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--generators=no"])
        .arg(format!("--root={}", root.display()))
        .arg(unit)
        .output()
        .context("running systemd-analyze")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), said))
}

/// The units to verify: an instance of the template, and the other.
pub const VERIFIED: [&str; 2] = ["profiler-watch@redis-server.service", CONFIGURED];

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    /// A root for `systemd-analyze verify --root`: the host's own units,
    /// ours, and stand-ins for the programs their Exec lines name.
    fn verify_root(tag: &str, template: &str, configured: &str) -> Option<PathBuf> {
        let root = std::env::temp_dir().join(format!("xtask-units-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        if !host_units_into(&root).unwrap() {
            eprintln!(
                "SKIP dist::systemd: systemd-analyze or /lib/systemd/system missing; run \
                 `cargo xtask setup` (Debian package systemd)"
            );
            return None;
        }
        let units = root.join(UNIT_DIR);
        std::fs::write(units.join(TEMPLATE), template).unwrap();
        std::fs::write(units.join(CONFIGURED), configured).unwrap();
        for path in ["usr/bin/profiler", "bin/kill"] {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&file, PermissionsExt::from_mode(0o755)).unwrap();
        }
        let defaults = root.join(DEFAULTS);
        std::fs::create_dir_all(defaults.parent().unwrap()).unwrap();
        std::fs::write(defaults, super::defaults()).unwrap();
        Some(root)
    }

    #[test]
    fn units_verify_clean() {
        let Some(root) = verify_root("clean", &template_unit(), &configured_unit()) else {
            return;
        };
        for unit in VERIFIED {
            let (ok, said) = verify(&root, unit).unwrap();
            assert!(ok && said.trim().is_empty(), "{unit}: {said}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn verify_catches_a_bad_unit() {
        // What the clean test relies on: a wrong value, an unknown key and
        // a missing program are each said.
        let broken = template_unit()
            .replace("ProtectSystem=strict", "ProtectSystem=stric\nNoSuchKey=1")
            .replace("/usr/bin/profiler", "/usr/bin/profilerx");
        let Some(root) = verify_root("broken", &broken, &configured_unit()) else {
            return;
        };
        let (ok, said) = verify(&root, VERIFIED[0]).unwrap();
        assert!(!ok, "{said}");
        for words in ["stric", "NoSuchKey", "/usr/bin/profilerx"] {
            assert!(said.contains(words), "{words}: {said}");
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn units_say_what_the_issue_asks() {
        for unit in [template_unit(), configured_unit()] {
            let line = |key: &str| {
                unit.lines()
                    .find(|l| l.starts_with(&format!("{key}=")))
                    .unwrap_or_else(|| panic!("no {key}= in\n{unit}"))
                    .to_owned()
            };
            assert!(line("StateDirectory").starts_with("StateDirectory=profiler/watch "));
            assert_eq!(line("StateDirectoryMode"), "StateDirectoryMode=0750");
            assert_eq!(line("ExecReload"), "ExecReload=/bin/kill -HUP $MAINPID");
            let caps: Vec<&str> = CAPABILITIES.iter().map(|(c, _)| *c).collect();
            assert_eq!(
                line("CapabilityBoundingSet"),
                format!("CapabilityBoundingSet={}", caps.join(" "))
            );
            assert!(!unit.contains("\nPrivateTmp="), "perf maps live in /tmp");
            assert!(line("ExecStart").contains("--out /var/lib/profiler/watch/"));
        }
        assert!(template_unit().contains(
            "ExecStart=/usr/bin/profiler watch --unit %i.service --out /var/lib/profiler/watch/%i $PROFILER_WATCH_ARGS\n"
        ));
    }

    #[test]
    fn logrotate_reads_the_snippet() {
        if find_program("logrotate").is_none() {
            eprintln!("SKIP dist::systemd: logrotate missing; run `cargo xtask setup` (Debian package logrotate)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("xtask-logrotate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("profiler-watch");
        std::fs::write(&conf, logrotate()).unwrap();
        // logrotate refuses a config file others may write.
        std::fs::set_permissions(&conf, PermissionsExt::from_mode(0o644)).unwrap();
        let out = Command::new("logrotate")
            .arg("--debug")
            .arg("--state")
            .arg(dir.join("state"))
            .arg(&conf)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{said}");
        assert!(!said.contains("error"), "{said}");
        assert!(said.contains("stalls.jsonl"), "{said}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
