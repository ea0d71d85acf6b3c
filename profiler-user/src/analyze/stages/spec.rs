//! `--stage`, `--scenario` and `--runs`: parsing, checking, and resolving
//! function names to probe indices.
use crate::{Error, Result};

/// One `--stage` as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageSpec {
    /// Stage name, shown in the report.
    pub name: String,
    /// Function whose entry starts the stage.
    pub start: String,
    /// Function whose exit ends the stage.
    pub end: String,
    /// `NAME=FUNC`: one function's outermost entry..exit.
    pub same_func: bool,
}

/// A stage with its functions mapped to probe indices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedStage {
    /// Stage name.
    pub name: String,
    /// Probe index of the function whose entry starts the stage.
    pub start_func: u32,
    /// Probe index of the function whose exit ends the stage. Equal to
    /// `start_func` for `NAME=FUNC` (and `NAME=F..F`, which means the same).
    pub end_func: u32,
}

fn bad(arg: &str) -> Error {
    Error::Usage(format!(
        "bad --stage {arg:?}: expected NAME=FUNC or NAME=A..B"
    ))
}

/// Byte offset of the first `..` that is exactly two dots (so C++ `...`
/// in a demangled name is not taken for the range separator).
fn range_sep(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    (0..b.len().saturating_sub(1)).find(|&i| {
        b[i] == b'.'
            && b[i + 1] == b'.'
            && (i == 0 || b[i - 1] != b'.')
            && b.get(i + 2) != Some(&b'.')
    })
}

impl StageSpec {
    /// Parses `NAME=FUNC` or `NAME=A..B`. The name ends at the first `=`
    /// (function names such as `operator==` may contain more).
    pub fn parse(arg: &str) -> Result<Self> {
        let (name, funcs) = arg.split_once('=').ok_or_else(|| bad(arg))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(bad(arg));
        }
        let (start, end, same_func) = match range_sep(funcs) {
            Some(i) => (funcs[..i].trim(), funcs[i + 2..].trim(), false),
            None => (funcs.trim(), funcs.trim(), true),
        };
        if start.is_empty() || end.is_empty() {
            return Err(bad(arg));
        }
        Ok(StageSpec {
            name: name.to_string(),
            start: start.to_string(),
            end: end.to_string(),
            same_func,
        })
    }

    /// Maps the function names to probe indices with `lookup`; an unknown
    /// function is a usage error naming the stage.
    pub fn resolve(&self, mut lookup: impl FnMut(&str) -> Option<u32>) -> Result<ResolvedStage> {
        let mut find = |f: &str| {
            lookup(f).ok_or_else(|| {
                Error::Usage(format!(
                    "--stage {:?}: no probed function is named {f:?}; check the name with `profiler list`",
                    self.name
                ))
            })
        };
        let start_func = find(&self.start)?;
        let end_func = if self.same_func {
            start_func
        } else {
            find(&self.end)?
        };
        Ok(ResolvedStage {
            name: self.name.clone(),
            start_func,
            end_func,
        })
    }
}

/// Every stage option of one session, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagesConfig {
    /// All `--stage`s, in command-line order.
    pub stages: Vec<StageSpec>,
    /// One scenario per `--scenario`, as an index into `stages` (its root
    /// stage). Without `--scenario`, the first stage is the only root.
    pub roots: Vec<usize>,
    /// Runs wanted per scenario (`--runs`, default 1).
    pub runs: usize,
}

impl StagesConfig {
    /// Parses the raw `--stage` / `--scenario` / `--runs` values. Stage
    /// names must be unique; each scenario must name a stage.
    pub fn parse(stages: &[String], scenarios: &[String], runs: Option<usize>) -> Result<Self> {
        let stages = stages
            .iter()
            .map(|s| StageSpec::parse(s))
            .collect::<Result<Vec<_>>>()?;
        for (i, s) in stages.iter().enumerate() {
            if stages[..i].iter().any(|o| o.name == s.name) {
                return Err(Error::Usage(format!(
                    "--stage name {:?} is used twice; give each stage its own name",
                    s.name
                )));
            }
        }
        if stages.is_empty() && (!scenarios.is_empty() || runs.is_some()) {
            return Err(Error::Usage(
                "--scenario and --runs need at least one --stage NAME=FUNC".into(),
            ));
        }
        let roots = if scenarios.is_empty() {
            if stages.is_empty() {
                vec![]
            } else {
                vec![0]
            }
        } else {
            let mut roots = Vec::new();
            for sc in scenarios {
                let i = stages.iter().position(|s| &s.name == sc).ok_or_else(|| {
                    Error::Usage(format!(
                        "--scenario {sc:?} names no --stage; add --stage '{sc}=FUNC'"
                    ))
                })?;
                if !roots.contains(&i) {
                    roots.push(i);
                }
            }
            roots
        };
        let runs = runs.unwrap_or(1);
        if runs == 0 {
            return Err(Error::Usage("--runs must be at least 1".into()));
        }
        Ok(StagesConfig {
            stages,
            roots,
            runs,
        })
    }

    /// Function names the stages need probed (deduplicated, in order).
    pub fn functions(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for s in &self.stages {
            for f in [s.start.as_str(), s.end.as_str()] {
                if !out.contains(&f) {
                    out.push(f);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms() {
        let s = StageSpec::parse("Load=load_file").unwrap();
        assert_eq!((s.name.as_str(), s.start.as_str()), ("Load", "load_file"));
        assert!(s.same_func && s.end == "load_file");
        let s = StageSpec::parse(" Open Document = app::open .. app::render ").unwrap();
        assert_eq!(s.name, "Open Document");
        assert_eq!(
            (s.start.as_str(), s.end.as_str()),
            ("app::open", "app::render")
        );
        assert!(!s.same_func);
        let s = StageSpec::parse("Cmp=operator==").unwrap();
        assert_eq!(s.start, "operator==");
        let s = StageSpec::parse("V=f<int...>..g").unwrap();
        assert_eq!((s.start.as_str(), s.end.as_str()), ("f<int...>", "g"));
    }

    #[test]
    fn rejects_bad_syntax() {
        for arg in ["Load", "=f", "Load=", "Load=a..", "Load=..b", "Load= .. "] {
            let e = StageSpec::parse(arg).unwrap_err().to_string();
            assert!(
                e.starts_with("bad --stage") && e.ends_with("expected NAME=FUNC or NAME=A..B"),
                "{arg}: {e}"
            );
        }
    }

    #[test]
    fn resolves_names() {
        let idx = |f: &str| ["a", "b"].iter().position(|x| *x == f).map(|i| i as u32);
        let r = StageSpec::parse("X=a..b").unwrap().resolve(idx).unwrap();
        assert_eq!((r.start_func, r.end_func), (0, 1));
        let e = StageSpec::parse("X=a..zz")
            .unwrap()
            .resolve(idx)
            .unwrap_err();
        assert!(e.to_string().contains("\"zz\""), "{e}");
    }

    #[test]
    fn config_roots_and_runs() {
        let st = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let c = StagesConfig::parse(&st(&["A=f", "B=g..h"]), &[], None).unwrap();
        assert_eq!((c.roots.clone(), c.runs), (vec![0], 1));
        assert_eq!(c.functions(), ["f", "g", "h"]);
        let c = StagesConfig::parse(&st(&["A=f", "B=g"]), &st(&["B", "A"]), Some(5)).unwrap();
        assert_eq!((c.roots, c.runs), (vec![1, 0], 5));
        let e = StagesConfig::parse(&st(&["A=f"]), &st(&["Z"]), None).unwrap_err();
        assert!(e.to_string().contains("--scenario \"Z\""), "{e}");
        assert!(StagesConfig::parse(&st(&["A=f", "A=g"]), &[], None).is_err());
        assert!(StagesConfig::parse(&st(&["A=f"]), &[], Some(0)).is_err());
        assert!(StagesConfig::parse(&[], &[], Some(3)).is_err());
        assert!(StagesConfig::parse(&[], &[], None)
            .unwrap()
            .roots
            .is_empty());
    }
}
