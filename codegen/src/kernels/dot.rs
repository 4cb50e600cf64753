//! The lane-split dot products of the warp-per-output kernels (the MoE experts, MLA's per-head
//! matmuls): a warp splits a weight row over its lanes in 8-element chunks, each lane's part
//! summed by the caller with [`Body::warp_sum`]. An `impl Body` block of its own, as rope.rs's.

use crate::kernels::*;

/// Rounds (32 lanes x 8 elements) of a [`Body::lane_dot`] per step of its loop over long rows.
const DOT_UNROLL: usize = 4;

impl Body {
    /// This lane's part of the dot product of a weight row (elements `woff..woff + k` of `w`,
    /// f32/bf16/f16) with an f32 row (elements `xoff..` of `x`), for a warp that splits the
    /// row over its lanes (`lane`, i64; sum the parts with [`Body::warp_sum`]): 8-element
    /// chunks `lane + 32 j` by 16-byte loads where k is a multiple of 8 (both offsets then
    /// multiples of 8), else elements `lane + 32 j`. The MoE experts and MLA's per-head
    /// matmuls.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lane_dot(&mut self, w: &str, woff: &str, wdtype: DType, x: &str, xoff: &str, k: usize, lane: &str) -> Result<String, String> {
        Ok(self.lane_dots(w, &[woff.to_string()], wdtype, x, xoff, k, lane)?.remove(0))
    }
    /// [`Body::lane_dot`] of several weight rows (`woffs`) with one x row: each round loads x
    /// once and every row's chunk before any arithmetic, so all rows' loads are in flight
    /// together; each row's sum is formed as `lane_dot` forms it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lane_dots(&mut self, w: &str, woffs: &[String], wdtype: DType, x: &str, xoff: &str, k: usize, lane: &str) -> Result<Vec<String>, String> {
        let zero = self.cf32(0.0);
        let rows = woffs.len();
        let (unit, units) = if k % 8 == 0 { (8, k / 8) } else { (1, k) };
        let cu = self.ci64(unit as i64);
        // one round: unit `c` (i64) of the rows, this lane's parts
        let round = |b: &mut Body, c: &str| -> Result<Vec<String>, String> {
            let el = b.op(&format!("arith.muli {c}, {cu} : i64"));
            let xe = b.op(&format!("arith.addi {xoff}, {el} : i64"));
            let wes: Vec<String> = woffs.iter().map(|woff| b.op(&format!("arith.addi {woff}, {el} : i64"))).collect();
            let zero = b.cf32(0.0);
            let mut parts = vec![];
            if unit == 8 {
                let c4 = b.ci64(4);
                let xb = b.op(&format!("arith.muli {xe}, {c4} : i64"));
                let xs = b.load_f32s(x, &xb, 8);
                let mut wss = vec![];
                for we in &wes {
                    wss.push(match wdtype {
                        DType::F32 => {
                            let wb = b.op(&format!("arith.muli {we}, {c4} : i64"));
                            b.load_f32s(w, &wb, 8)
                        }
                        DType::BF16 | DType::F16 => {
                            let c2 = b.ci64(2);
                            let wb = b.op(&format!("arith.muli {we}, {c2} : i64"));
                            let words = b.load_vec(w, &wb, 4, "i32", 16);
                            b.half_words(&words, wdtype)
                        }
                        // (rows of whole super-blocks: eight values of one group, one 8-byte load)
                        DType::F8G128 => f8g128_eight(b, w, we),
                        other => return Err(format!("{other} is not a plain float type")),
                    });
                }
                for ws in wss {
                    let mut part = zero.clone();
                    for (wv, xv) in ws.iter().zip(&xs) {
                        part = b.op(&format!("llvm.intr.fma({wv}, {xv}, {part}) : (f32, f32, f32) -> f32"));
                    }
                    parts.push(part);
                }
            } else {
                let xv = b.load(x, &xe);
                let mut wvs = vec![];
                for we in &wes {
                    wvs.push(b.plain_as_f32(w, we, wdtype)?);
                }
                for wv in wvs {
                    parts.push(b.op(&format!("arith.mulf {wv}, {xv} : f32")));
                }
            }
            Ok(parts)
        };
        let full = units / 32;
        // (long rows: the full rounds in a loop of DOT_UNROLL rounds a step, so the loads in
        // flight stay within the registers — V3's 7,168-wide rows spilled fully unrolled)
        let looped = if full > 2 * DOT_UNROLL { full / DOT_UNROLL * DOT_UNROLL } else { 0 };
        let mut accs = vec![zero.clone(); rows];
        if looped > 0 {
            let (res, iv) = (self.v(), self.v());
            let args: Vec<String> = (0..rows).map(|_| self.v()).collect();
            let tys = vec!["f32"; rows].join(", ");
            let (c0, cl, cs) = (self.op("arith.constant 0 : index"), self.op(&format!("arith.constant {looped} : index")), self.op(&format!("arith.constant {DOT_UNROLL} : index")));
            let inits: Vec<String> = args.iter().map(|a| format!("{a} = {zero}")).collect();
            self.line(&format!("{res}:{rows} = scf.for {iv} = {c0} to {cl} step {cs} iter_args({}) -> ({tys}) {{", inits.join(", ")));
            let r0 = self.idx64(&iv);
            let mut parts = vec![];
            for q in 0..DOT_UNROLL {
                let cq = self.ci64(q as i64);
                let r = self.op(&format!("arith.addi {r0}, {cq} : i64"));
                let c32 = self.ci64(32);
                let c = self.op(&format!("arith.muli {r}, {c32} : i64"));
                let c = self.op(&format!("arith.addi {c}, {lane} : i64"));
                parts.push(round(self, &c)?);
            }
            let mut sums = args.clone();
            for p in parts {
                for (s, v) in sums.iter_mut().zip(p) {
                    *s = self.op(&format!("arith.addf {s}, {v} : f32"));
                }
            }
            self.line(&format!("scf.yield {} : {tys}", sums.join(", ")));
            self.line("}");
            accs = (0..rows).map(|i| format!("{res}#{i}")).collect();
        }
        for j in looped..units.div_ceil(32) {
            let cj = self.ci64(32 * j as i64);
            let c = self.op(&format!("arith.addi {lane}, {cj} : i64"));
            let valid = (32 * (j + 1) > units).then(|| {
                let cn = self.ci64(units as i64);
                self.op(&format!("arith.cmpi slt, {c}, {cn} : i64"))
            });
            let c = match &valid {
                Some(_) => {
                    let last = self.ci64(units as i64 - 1);
                    self.op(&format!("arith.minsi {c}, {last} : i64"))
                }
                None => c,
            };
            let parts = round(self, &c)?;
            for (acc, mut part) in accs.iter_mut().zip(parts) {
                if let Some(v) = &valid {
                    part = self.op(&format!("arith.select {v}, {part}, {zero} : f32"));
                }
                *acc = self.op(&format!("arith.addf {acc}, {part} : f32"));
            }
        }
        Ok(accs)
    }
}
