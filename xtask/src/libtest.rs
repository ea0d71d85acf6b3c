//! Reading libtest's plain output, run with `--show-output`: the result of
//! each test (`test NAME ... ok`), the `test result:` totals, and the
//! `SKIP …` lines a test printed to say why it did not run (captured by
//! libtest and shown after the run under `successes:`).
//!
//! The captured output of passing tests is long (every profiler line of
//! every integration test); [`Parser::feed`] says which lines are worth
//! echoing: everything but that, plus the SKIP lines.

use std::collections::BTreeMap;

/// The result of one test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Passed (and printed no SKIP line).
    Ok,
    /// Failed.
    Failed,
    /// `#[ignore]`d, with the reason if one was given.
    Ignored(Option<String>),
    /// Passed without running its check, printing why.
    Skipped(String),
}

/// Totals over all the `test result:` lines seen, plus the SKIP lines.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    /// Passed tests that printed a SKIP line (counted in `passed` too).
    pub skipped: u64,
    /// Seconds the test binaries said they ran (`finished in 0.56s`),
    /// rounded up.
    pub secs: u64,
}

/// Where in libtest's output we are.
#[derive(Debug, Default, PartialEq, Eq)]
enum Section {
    /// `test … ... ok` lines and the like.
    #[default]
    Running,
    /// After `successes:`: captured output of passing tests.
    Successes,
    /// After `failures:`: captured output of failing tests.
    Failures,
}

/// Reads libtest's output line by line.
#[derive(Debug, Default)]
pub struct Parser {
    section: Section,
    /// The test whose captured output follows (`---- NAME stdout ----`).
    current: Option<String>,
    /// The last test whose `test NAME ... ` line had no result on it: a
    /// child's output was written into the line. When its binary ran it
    /// alone (`cargo xtask kernels`), the totals say how it ended.
    garbled: Option<String>,
    /// Each test's status, by full name.
    pub results: BTreeMap<String, Status>,
    /// Each skipping test's SKIP lines.
    pub skip_lines: Vec<String>,
    /// (test, line) for each `RELAXED …` line a test printed: a timing
    /// assertion widened under software emulation (`cargo xtask kernels`).
    pub relaxed: Vec<(String, String)>,
    /// Summed totals.
    pub counts: Counts,
}

impl Parser {
    /// Takes in one line; returns whether it is worth echoing.
    pub fn feed(&mut self, line: &str) -> bool {
        if let Some(rest) = line.strip_prefix("test result: ") {
            let before = self.counts.clone();
            self.add_totals(rest);
            if let Some(name) = self.garbled.take() {
                let (passed, failed) = (
                    self.counts.passed - before.passed,
                    self.counts.failed - before.failed,
                );
                match (passed, failed) {
                    (1, 0) => {
                        self.results.entry(name).or_insert(Status::Ok);
                    }
                    (0, 1) => {
                        self.results.insert(name, Status::Failed);
                    }
                    _ => {}
                }
            }
            self.section = Section::Running;
            self.current = None;
            return true;
        }
        match line {
            "successes:" => {
                self.section = Section::Successes;
                self.current = None;
                return false;
            }
            "failures:" => {
                self.section = Section::Failures;
                self.current = None;
                return true;
            }
            _ => {}
        }
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|l| l.strip_suffix(" stdout ----"))
        {
            // A failure's output names it even when its `test … FAILED`
            // line was garbled (a child's output written into it).
            if self.section == Section::Failures {
                self.results.insert(name.to_string(), Status::Failed);
            }
            self.current = Some(name.to_string());
            return self.section != Section::Successes;
        }
        if self.section == Section::Running {
            if let Some((name, status)) = parse_result(line) {
                self.results.insert(name, status);
            } else if let Some((name, _)) = line
                .strip_prefix("test ")
                .and_then(|l| l.split_once(" ... "))
            {
                self.garbled = Some(name.to_string());
            }
            return true;
        }
        if let (Some(name), Some(what)) = (&self.current, line.strip_prefix("RELAXED ")) {
            self.relaxed.push((name.clone(), what.to_string()));
            return true;
        }
        if let (Some(name), Some(why)) = (&self.current, line.strip_prefix("SKIP ")) {
            self.skip_lines.push(line.to_string());
            self.counts.skipped += 1;
            // A test whose result line was garbled has none yet: the
            // totals after its output will not write over this.
            let s = self
                .results
                .entry(name.clone())
                .or_insert(Status::Skipped(String::new()));
            *s = match s {
                Status::Skipped(prev) if !prev.is_empty() => {
                    Status::Skipped(format!("{prev}; {why}"))
                }
                _ => Status::Skipped(why.to_string()),
            };
            return true;
        }
        self.section == Section::Failures
    }

    /// Adds `ok. 3 passed; 0 failed; 1 ignored; ...`.
    fn add_totals(&mut self, rest: &str) {
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            if n == "in" {
                if let Ok(t) = what.trim_end_matches('s').parse::<f64>() {
                    self.counts.secs += t.ceil() as u64;
                }
                continue;
            }
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.counts.passed += n,
                "failed" => self.counts.failed += n,
                "ignored" => self.counts.ignored += n,
                _ => {}
            }
        }
    }
}

/// `test NAME ... ok` (or `FAILED`, `ignored`, `ignored, REASON`).
fn parse_result(line: &str) -> Option<(String, Status)> {
    let (name, result) = line.strip_prefix("test ")?.split_once(" ... ")?;
    let status = match result.trim_end() {
        "ok" => Status::Ok,
        "FAILED" => Status::Failed,
        "ignored" => Status::Ignored(None),
        r => Status::Ignored(Some(r.strip_prefix("ignored, ")?.to_string())),
    };
    Some((name.to_string(), status))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = "\
running 4 tests
test a::one ... ok
test a::two ... FAILED
test b::row15_x ... ok
test b::row99 ... ignored, defect: it breaks

successes:

---- b::row15_x stdout ----
[profiler] noise
SKIP row15: cannot provoke it here
RELAXED a duration: 30% instead of 5%

successes:
    a::one
    b::row15_x

failures:

---- a::two stdout ----
assertion failed

failures:
    a::two

test result: FAILED. 2 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.56s
";

    #[test]
    fn results_skips_and_totals() {
        let mut p = Parser::default();
        let echoed: Vec<&str> = RUN.lines().filter(|l| p.feed(l)).collect();
        assert_eq!(p.results["a::one"], Status::Ok);
        assert_eq!(p.results["a::two"], Status::Failed);
        assert_eq!(
            p.results["b::row15_x"],
            Status::Skipped("row15: cannot provoke it here".into())
        );
        assert_eq!(
            p.results["b::row99"],
            Status::Ignored(Some("defect: it breaks".into()))
        );
        assert_eq!(
            p.counts,
            Counts {
                passed: 2,
                failed: 1,
                ignored: 1,
                skipped: 1,
                secs: 1,
            }
        );
        assert!(echoed.contains(&"SKIP row15: cannot provoke it here"));
        assert_eq!(
            p.relaxed,
            vec![(
                "b::row15_x".to_string(),
                "a duration: 30% instead of 5%".to_string()
            )]
        );
        assert!(echoed.contains(&"assertion failed"));
        assert!(!echoed.contains(&"[profiler] noise"), "{echoed:?}");
    }

    #[test]
    fn a_failure_whose_result_line_was_garbled_is_still_a_failure() {
        let mut p = Parser::default();
        for l in [
            "test g::crashes ... fatal error: fault",
            "goroutine 1 [running]:",
            "failures:",
            "",
            "---- g::crashes stdout ----",
            "panicked",
            "",
            "failures:",
            "    g::crashes",
        ] {
            p.feed(l);
        }
        assert_eq!(p.results["g::crashes"], Status::Failed);
    }

    #[test]
    fn a_test_run_alone_whose_result_line_was_garbled_takes_its_totals() {
        let mut p = Parser::default();
        for l in [
            "running 1 test",
            "test g::doc ... runtime: unexpected return pc",
            "goroutine 6 [running]:",
            "ok",
            "",
            "successes:",
            "",
            "---- g::doc stdout ----",
            "SKIP not on this kernel",
            "",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out; finished in 1.00s",
            "running 1 test",
            "test r::row24 ... 26\tread.c: No such file or directory.",
            "ok",
            "test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out; finished in 1.00s",
            "running 1 test",
            "test r::bad ... child output",
            "FAILED",
            "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 9 filtered out; finished in 1.00s",
        ] {
            p.feed(l);
        }
        assert_eq!(
            p.results["g::doc"],
            Status::Skipped("not on this kernel".into())
        );
        assert_eq!(p.results["r::row24"], Status::Ok);
        assert_eq!(p.results["r::bad"], Status::Failed);
    }

    #[test]
    fn totals_add_up_over_binaries() {
        let mut p = Parser::default();
        p.feed("test result: ok. 72 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.56s");
        p.feed("test result: FAILED. 3 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out");
        p.feed("test foo ... ok");
        assert_eq!(
            (p.counts.passed, p.counts.failed, p.counts.ignored),
            (75, 2, 1)
        );
        // 0.56 s rounded up; the line without a time adds none.
        assert_eq!(p.counts.secs, 1);
    }
}
