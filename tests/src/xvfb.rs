//! An Xvfb server for the GUI fixtures (Tk, Swing).
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// An Xvfb server of our own, on the display it picked; killed on drop.
pub struct Xvfb {
    child: Child,
    /// `:N`, for `DISPLAY`.
    pub display: String,
}

impl Xvfb {
    /// None when Xvfb is missing or does not start.
    pub fn start() -> Option<Xvfb> {
        let mut child = Command::new("Xvfb")
            .args([
                "-displayfd",
                "1",
                "-nolisten",
                "tcp",
                "-screen",
                "0",
                "640x480x24",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut line = String::new();
        let read = BufReader::new(child.stdout.take()?).read_line(&mut line);
        let n: u32 = match read {
            Ok(_) => line.trim().parse().ok()?,
            Err(_) => return None,
        };
        Some(Xvfb {
            child,
            display: format!(":{n}"),
        })
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
