//! Instruction indexes to line numbers, from a code object's line table.

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
}
