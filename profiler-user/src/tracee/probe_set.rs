//! Several processes' selections as one (several `--pid`, `--pid-of`, and
//! the programs traced processes exec under `--follow`): a function is
//! probed once per file and offset, however many processes run it, since
//! a uprobe belongs to the file (its inode), not to a process.
use std::{collections::HashSet, os::unix::fs::MetadataExt};

use super::select::{Binary, Selection};

/// A file, by device and inode.
type FileId = (u64, u64);

fn file_id(b: &Binary) -> Option<FileId> {
    std::fs::metadata(&b.open_path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// The functions probed so far, by file and offset.
#[derive(Debug, Default)]
pub struct Probed {
    files: Vec<Option<FileId>>,
    funcs: HashSet<(Option<FileId>, u64)>,
}

impl Probed {
    /// Starts from `sel`, as attached.
    pub fn of(sel: &Selection) -> Self {
        let files: Vec<Option<FileId>> = sel.binaries.iter().map(file_id).collect();
        let funcs = sel
            .funcs
            .iter()
            .map(|f| (files[f.binary as usize], f.offset))
            .collect();
        Probed { files, funcs }
    }

    /// Appends to `sel` the functions of `new` it does not probe yet (and
    /// the binaries they are in); returns the index of the first one added.
    /// `max_funcs` caps the total; those left out are counted in
    /// `sel.capped`.
    pub fn merge(&mut self, sel: &mut Selection, new: Selection, max_funcs: usize) -> usize {
        let first = sel.funcs.len();
        let ids: Vec<Option<FileId>> = new.binaries.iter().map(file_id).collect();
        let mut index: Vec<Option<u32>> = vec![None; new.binaries.len()];
        for mut f in new.funcs {
            let bi = f.binary as usize;
            let key = (ids[bi], f.offset);
            if ids[bi].is_some() && self.funcs.contains(&key) {
                continue;
            }
            if sel.funcs.len() >= max_funcs {
                sel.capped += 1;
                continue;
            }
            let global = match index[bi] {
                Some(g) => g,
                None => {
                    let g = match self.files.iter().position(|&x| x.is_some() && x == ids[bi]) {
                        Some(g) => g as u32,
                        None => {
                            sel.binaries.push(new.binaries[bi].clone());
                            self.files.push(ids[bi]);
                            (sel.binaries.len() - 1) as u32
                        }
                    };
                    index[bi] = Some(g);
                    g
                }
            };
            self.funcs.insert(key);
            f.binary = global;
            sel.funcs.push(f);
        }
        sel.capped += new.capped;
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracee::{exits::ExitProbe, select::Func};

    fn sel(path: &str, offsets: &[u64]) -> Selection {
        Selection {
            binaries: vec![Binary {
                path: path.into(),
                open_path: path.into(),
                go: false,
                unmapped: None,
            }],
            funcs: offsets
                .iter()
                .map(|&offset| Func {
                    name: format!("f{offset}"),
                    binary: 0,
                    offset,
                    dispatch: false,
                    exit: ExitProbe::Uretprobe,
                    unprobed: None,
                    semaphores: [0; 2],
                    tails: Vec::new(),
                    entry_shift: 0,
                    cost: Default::default(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn same_file_is_probed_once_and_new_files_append() {
        let exe = std::env::current_exe().unwrap();
        let exe = exe.to_str().unwrap();
        let mut all = sel(exe, &[16, 32]);
        let mut probed = Probed::of(&all);
        // The same file by another path, one new offset.
        let again = format!("/proc/{}/exe", std::process::id());
        assert_eq!(probed.merge(&mut all, sel(&again, &[32, 48]), 100), 2);
        assert_eq!(all.funcs.len(), 3);
        assert_eq!(all.binaries.len(), 1);
        assert_eq!((all.funcs[2].offset, all.funcs[2].binary), (48, 0));
        // Another file.
        assert_eq!(probed.merge(&mut all, sel("/bin/sh", &[16]), 100), 3);
        assert_eq!(all.binaries.len(), 2);
        assert_eq!(all.funcs[3].binary, 1);
        // The cap.
        assert_eq!(probed.merge(&mut all, sel("/bin/sh", &[64, 80]), 5), 4);
        assert_eq!((all.funcs.len(), all.capped), (5, 1));
    }
}
