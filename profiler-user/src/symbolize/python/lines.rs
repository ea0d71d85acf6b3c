//! Instruction indexes to line numbers, from a code object's line table:
//! 3.11's locations ([`line_of`]), 3.10's `co_linetable`
//! ([`line_of_310`]), and 3.8's and 3.9's `co_lnotab` ([`line_of_lnotab`]).
//! An index counts code units (two bytes) from the start of the bytecode
//! in every version.

/// The format of a code object's line table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `co_lnotab` (3.8, 3.9).
    Lnotab,
    /// `co_linetable` of 3.10.
    Linetable310,
    /// `co_linetable` of 3.11 and later.
    Locations,
}

impl Format {
    /// The format of CPython 3.`minor`'s table.
    pub fn of(minor: u32) -> Format {
        match minor {
            ..=9 => Format::Lnotab,
            10 => Format::Linetable310,
            _ => Format::Locations,
        }
    }

    /// The line of instruction `index` in `table`, for a code object
    /// whose first line is `first`.
    pub fn line(self, table: &[u8], first: i32, index: u64) -> Option<i32> {
        match self {
            Format::Lnotab => line_of_lnotab(table, first, index),
            Format::Linetable310 => line_of_310(table, first, index),
            Format::Locations => line_of(table, first, index),
        }
    }
}

/// The line of instruction `index` from a `co_lnotab` (3.8, 3.9): pairs
/// of (bytes advanced, lines advanced as a signed byte), the line changing
/// once the address is past the bytes advanced, as CPython's
/// `PyCode_Addr2Line` reads it.
pub fn line_of_lnotab(table: &[u8], first: i32, index: u64) -> Option<i32> {
    let want = index.checked_mul(2)?;
    let (mut addr, mut line) = (0u64, first);
    for pair in table.chunks_exact(2) {
        addr += u64::from(pair[0]);
        if addr > want {
            break;
        }
        line += i32::from(pair[1] as i8);
    }
    Some(line)
}

/// The line of instruction `index` from a 3.10 `co_linetable`: pairs of
/// (bytes the range covers, lines advanced as a signed byte, -128 for a
/// range without a line), as CPython 3.10's `PyCode_Addr2Line` reads it.
pub fn line_of_310(table: &[u8], first: i32, index: u64) -> Option<i32> {
    let want = index.checked_mul(2)?;
    let (mut end, mut line) = (0u64, first);
    for pair in table.chunks_exact(2) {
        end += u64::from(pair[0]);
        let here = match pair[1] as i8 {
            -128 => None,
            delta => {
                line += i32::from(delta);
                Some(line)
            }
        };
        if want < end {
            return here;
        }
    }
    None
}

/// The line of instruction `index` (code units) from a 3.11+ location
/// table (`co_linetable`, PEP 626/657's format), starting at `first`.
pub fn line_of(table: &[u8], first: i32, index: u64) -> Option<i32> {
    let mut pos = 0usize;
    let mut line = first;
    let mut addr = 0u64;
    let next = |pos: &mut usize| -> Option<u8> {
        let b = *table.get(*pos)?;
        *pos += 1;
        Some(b)
    };
    let varint = |pos: &mut usize| -> Option<u32> {
        let mut b = next(pos)?;
        let mut val = u32::from(b & 63);
        let mut shift = 0;
        while b & 64 != 0 {
            b = next(pos)?;
            shift += 6;
            if shift > 30 {
                return None;
            }
            val |= u32::from(b & 63) << shift;
        }
        Some(val)
    };
    let svarint = |pos: &mut usize| -> Option<i32> {
        let v = varint(pos)?;
        Some(if v & 1 != 0 {
            -((v >> 1) as i32)
        } else {
            (v >> 1) as i32
        })
    };
    while pos < table.len() {
        let b = next(&mut pos)?;
        let code = (b >> 3) & 15;
        let len = u64::from(b & 7) + 1;
        let mut located = true;
        match code {
            15 => located = false,
            14 => {
                line += svarint(&mut pos)?;
                varint(&mut pos)?;
                varint(&mut pos)?;
                varint(&mut pos)?;
            }
            13 => line += svarint(&mut pos)?,
            10..=12 => {
                line += i32::from(code) - 10;
                pos += 2;
            }
            _ => pos += 1,
        }
        if index < addr + len {
            return located.then_some(line);
        }
        addr += len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_table_entries_of_each_form() {
        // Entries: short form (code 0, 2 units, line +0), one-line form
        // (code 11: +1, 1 unit), no-column form (code 13, +3, 1 unit), no
        // location (code 15, 1 unit), long form (code 14, -2, 2 units).
        let table = [
            0x80 | 1,
            0x00,
            0x80 | (11 << 3),
            0x01,
            0x02,
            0x80 | (13 << 3),
            6,
            0x80 | (15 << 3),
            0x80 | (14 << 3) | 1,
            5,
            0,
            1,
            1,
        ];
        let lines: Vec<_> = (0..8).map(|i| line_of(&table, 10, i)).collect();
        assert_eq!(
            lines,
            [
                Some(10),
                Some(10),
                Some(11),
                Some(14),
                None,
                Some(12),
                Some(12),
                None
            ]
        );
    }

    #[test]
    fn lnotab_lines_change_past_each_pair() {
        // 3.8's lnotab of `def f():\n  a = 1\n\n  b = 2\n  return a`
        // first line 1: (0, +1) (4, +2) (4, +1) → bytes 0-3 line 2, 4-7
        // line 4, 8- line 5; and a negative step (a loop's jump back).
        let table = [0, 1, 4, 2, 4, 1, 2, (-3i8) as u8];
        let lines: Vec<_> = (0..7).map(|i| line_of_lnotab(&table, 1, i)).collect();
        assert_eq!(
            lines,
            [
                Some(2),
                Some(2),
                Some(4),
                Some(4),
                Some(5),
                Some(2),
                Some(2)
            ]
        );
        assert_eq!(line_of_lnotab(&[], 7, 3), Some(7));
    }

    #[test]
    fn linetable_310_ranges_and_ranges_without_a_line() {
        // (2 bytes, +1) (4, -128: no line) (0, +2: empty) (6, +1): bytes
        // 0-1 line 11, 2-5 none, 6-11 line 14, past the end none.
        let table = [2, 1, 4, 0x80, 0, 2, 6, 1];
        let lines: Vec<_> = (0..7).map(|i| line_of_310(&table, 10, i)).collect();
        assert_eq!(
            lines,
            [Some(11), None, None, Some(14), Some(14), Some(14), None]
        );
    }

    /// Every instruction of real code objects, against CPython's own
    /// `co_lines()` / `dis.findlinestarts`, for each pyenv CPython
    /// 3.8-3.10 installed.
    #[test]
    fn old_tables_read_as_each_installed_cpython_reads_them() {
        let pyenv = std::env::var_os("PYENV_ROOT")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".pyenv")));
        let mut pythons: Vec<(u32, std::path::PathBuf)> = Vec::new();
        if let Some(Ok(versions)) = pyenv.map(|p| std::fs::read_dir(p.join("versions"))) {
            for v in versions.flatten() {
                for m in 8..=10 {
                    let p = v.path().join(format!("bin/python3.{m}"));
                    if p.exists() {
                        pythons.push((m, p));
                    }
                }
            }
        }
        if pythons.is_empty() {
            eprintln!("SKIP old_tables_read_as_each_installed_cpython_reads_them: no pyenv CPython 3.8-3.10");
            return;
        }
        // Prints, for each code object of this file, its first line, its
        // table in hex, then each instruction's index and the line
        // `frame.f_lineno` would give (3.10: co_lines; before: the last
        // line start at or before the instruction).
        let script = r#"
import dis, sys
def walk(co):
    yield co
    for c in co.co_consts:
        if hasattr(c, 'co_code'):
            yield from walk(c)
src = '''
def f(a):
    x = 0
    for i in range(a):

        if i % 3:
            x += i
        else:
            x -= 1
    while x > 100:
        x //= 2
    return [y * 2
            for y in range(x)]
class C:
    def m(self):
        try:
            return 1 / 0
        except ZeroDivisionError:
            pass
        finally:
            print("done")
'''
top = compile(src, 'x.py', 'exec')
for co in walk(top):
    table = co.co_linetable if sys.version_info >= (3, 10) else co.co_lnotab
    print('code', co.co_firstlineno, table.hex())
    if sys.version_info >= (3, 10):
        for start, end, line in co.co_lines():
            for b in range(start, end, 2):
                print(b // 2, line if line is not None else -1)
    else:
        starts = list(dis.findlinestarts(co))
        for b in range(0, len(co.co_code), 2):
            line = co.co_firstlineno
            for off, l in starts:
                if off <= b:
                    line = l
            print(b // 2, line)
"#;
        for (minor, python) in pythons {
            let out = std::process::Command::new(&python)
                .arg("-c")
                .arg(script)
                .output()
                .expect("run python");
            assert!(out.status.success(), "{}: {out:?}", python.display());
            let format = Format::of(minor);
            let (mut table, mut first, mut checked) = (Vec::new(), 0, 0);
            for l in String::from_utf8_lossy(&out.stdout).lines() {
                let w: Vec<&str> = l.split(' ').collect();
                if w[0] == "code" {
                    first = w[1].parse().unwrap();
                    table = (0..w.get(2).map_or(0, |h| h.len()) / 2)
                        .map(|i| u8::from_str_radix(&w[2][2 * i..2 * i + 2], 16).unwrap())
                        .collect();
                    continue;
                }
                let (index, line): (u64, i32) = (w[0].parse().unwrap(), w[1].parse().unwrap());
                let want = (line >= 0).then_some(line);
                assert_eq!(
                    format.line(&table, first, index),
                    want,
                    "{}: instruction {index} of the code object at line {first}",
                    python.display()
                );
                checked += 1;
            }
            assert!(
                checked > 100,
                "{}: {checked} instructions",
                python.display()
            );
            eprintln!("{}: {checked} instructions' lines match", python.display());
        }
    }
}
