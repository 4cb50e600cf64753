//! Tensor-parallel weight shards. A partitioned graph declares each weight with the shape one
//! rank holds; the checkpoint (and the plan) keep the full tensor. The two shapes differ in at
//! most one axis, where the full extent is `world` times the local one, and rank `r` holds
//! the `r`-th equal slice of that axis. Nothing else needs recording: the shard is implied by
//! (full shape, local shape, rank, world).

use crate::DType;

/// The part of a full tensor one rank holds: `len` entries of `axis` from `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub axis: usize,
    pub start: usize,
    pub len: usize,
}

/// Which slice of `full` rank `rank` of `world` holds when its graph declares `local`; None
/// when the tensor is replicated (the shapes are equal).
pub fn shard_of(full: &[usize], local: &[usize], rank: usize, world: usize) -> Result<Option<Shard>, String> {
    if full.len() != local.len() {
        return Err(format!("full shape {full:?} and rank shape {local:?} differ in rank"));
    }
    let diff: Vec<usize> = (0..full.len()).filter(|&i| full[i] != local[i]).collect();
    match diff.as_slice() {
        [] => Ok(None),
        [axis] => {
            let (f, l) = (full[*axis], local[*axis]);
            if l * world != f {
                return Err(format!("axis {axis}: {world} ranks of {l} do not make the full {f}"));
            }
            if rank >= world {
                return Err(format!("rank {rank} of a group of {world}"));
            }
            Ok(Some(Shard { axis: *axis, start: rank * l, len: l }))
        }
        _ => Err(format!("full shape {full:?} and rank shape {local:?} differ in more than one axis")),
    }
}

/// Cut a shard out of a full tensor's bytes (row-major; packed formats hold their blocks
/// along the last axis, so a cut across the last axis must fall on block boundaries).
pub fn slice_bytes(dtype: DType, full: &[usize], s: Shard, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let outer: usize = full[..s.axis].iter().product();
    let inner: usize = full[s.axis + 1..].iter().product();
    let span = |n: usize| dtype.bytes_for(n).ok_or_else(|| format!("{n} {dtype} elements are not whole blocks, so this shard cannot be cut"));
    let row = span(full[s.axis] * inner)?;
    let (off, len) = (span(s.start * inner)?, span(s.len * inner)?);
    if bytes.len() != row * outer {
        return Err(format!("{} bytes do not hold a {dtype}{full:?} tensor ({} expected)", bytes.len(), row * outer));
    }
    let mut out = Vec::with_capacity(len * outer);
    for o in 0..outer {
        out.extend_from_slice(&bytes[o * row + off..o * row + off + len]);
    }
    Ok(out)
}

/// For seeded weights generated on the device: element `i` of the shard is element
/// `(i / len) * stride + col0 + i % len` of the full tensor, after the stream start moves by
/// `row0` elements. Returns (row0, len, stride, col0) in elements.
pub fn seeded_layout(full: &[usize], s: Shard) -> (u64, u64, u64, u64) {
    let outer: usize = full[..s.axis].iter().product();
    let inner: usize = full[s.axis + 1..].iter().product();
    if outer == 1 {
        // a contiguous range
        ((s.start * inner) as u64, (s.len * inner) as u64, 0, 0)
    } else {
        (0, (s.len * inner) as u64, (full[s.axis] * inner) as u64, (s.start * inner) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_tile_the_full_tensor() {
        let full = [6usize, 64];
        let data: Vec<f32> = (0..6 * 64).map(|i| i as f32).collect();
        let bytes = crate::quant::encode(DType::F32, &data).unwrap();
        for (local, world) in [([3usize, 64], 2usize), ([6, 32], 2), ([6, 16], 4), ([6, 64], 3)] {
            let mut seen = vec![0u32; data.len()];
            for r in 0..world {
                let s = shard_of(&full, &local, r, world).unwrap();
                let Some(s) = s else {
                    assert_eq!(local, full);
                    continue;
                };
                let part = crate::quant::decode(DType::F32, &slice_bytes(DType::F32, &full, s, &bytes).unwrap(), local.iter().product()).unwrap();
                let (row0, len, stride, col0) = seeded_layout(&full, s);
                for (i, v) in part.iter().enumerate() {
                    let i = i as u64;
                    let src = row0 + if stride == 0 { i } else { (i / len) * stride + col0 + i % len };
                    assert_eq!(*v, data[src as usize]);
                    seen[src as usize] += 1;
                }
            }
            if local != full {
                assert!(seen.iter().all(|&c| c == 1), "{local:?}: every element in exactly one shard");
            }
        }
        assert!(shard_of(&[6, 64], &[4, 64], 0, 2).is_err());
        assert!(shard_of(&[6, 64], &[3, 32], 0, 2).is_err());
        // a Q8_0 cut inside a block is refused
        assert!(slice_bytes(DType::Q8_0, &[2, 64], Shard { axis: 1, start: 16, len: 16 }, &[0; 2 * 68]).is_err());
        assert_eq!(slice_bytes(DType::Q8_0, &[2, 64], Shard { axis: 1, start: 32, len: 32 }, &[7; 2 * 68]).unwrap().len(), 68);
    }
}
