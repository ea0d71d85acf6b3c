//! Hangs: a dispatch that has run past `--hang`, told while it runs.
use super::*;

impl Dispatcher {
    /// Checks for a hang at `now_ns` (CLOCK_MONOTONIC); a new one is
    /// recorded and queued as a [`Notice::Hang`].
    pub fn tick(&mut self, now_ns: u64) {
        let Some(open) = &mut self.open else { return };
        let running = now_ns.saturating_sub(open.start_ns);
        if open.hang_told || running < self.cfg.hang_ns || open.not_the_programs.is_some() {
            return;
        }
        let mut stack: Vec<String> = Vec::new();
        // Where it is now, past its innermost traced call: where it last
        // blocked, if that came after its last sample (a thread stuck in a
        // sleep or a lock is never sampled), else the last sample.
        let newest = match (&open.last_sample, &open.last_block) {
            (Some(s), Some(b)) if b.0 > s.0 => Some((&b.1, "blocked")),
            (Some(s), _) => Some((&s.1, "sampled")),
            (None, Some(b)) => Some((&b.1, "blocked")),
            (None, None) => None,
        };
        if let Some((user, how)) = newest {
            let mut names = self.symbolizer.user_stack(user);
            if self.symbolizer.take_missed() {
                // Not named yet (a library's symbols read for the first
                // time): asked again on the next ticks, for a while; then
                // the hang is told with its traced calls only.
                if running < self.cfg.hang_ns.saturating_add(HANG_NAMES_WAIT_NS) {
                    return;
                }
                names.clear();
                stack.push(NAMES_PENDING.to_string());
            }
            let traced = open
                .calls
                .last()
                .map(|&(f, _)| self.names[f as usize].clone());
            for n in names {
                if Some(&n) == traced.as_ref() {
                    break;
                }
                stack.push(format!("{} ({how})", frames::display(&n)));
            }
        }
        stack.extend(
            open.calls
                .iter()
                .rev()
                .map(|&(f, _)| self.names[f as usize].clone()),
        );
        let hang = Hang {
            index: open.index,
            start_ns: open.start_ns.saturating_sub(self.session_start_ns),
            reported_after_ns: running,
            duration_ns: None,
            stack,
        };
        self.notices.push(Notice::Hang {
            index: hang.index,
            tid: self.cfg.tid,
            running_ns: running,
            stack: hang.stack.clone(),
        });
        open.hang_told = true;
        if self.hangs.len() < MAX_HANGS {
            open.hang = Some(self.hangs.len());
            self.hangs.push(hang);
        } else {
            self.hangs_dropped += 1;
        }
    }
}
