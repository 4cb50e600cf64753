//! The GPU backend's weights: each graph weight uploaded from the plan (its rank's slice under
//! tensor parallelism) or generated on the device from its seed (`seeded_init_<dtype>`, a
//! shard reading its part of the full tensor's stream), with progress on a terminal.

use super::*;

/// Every weight of `graph` resident on `stream`'s device, by node name.
pub(super) fn upload(graph: &Graph, plan: &Plan, module: &Arc<CudaModule>, stream: &Arc<CudaStream>, spec: &RankSpec) -> Result<HashMap<String, CudaSlice<u8>>> {
    let mut resident = HashMap::new();
    // progress on a terminal, silent when piped (indicatif hides itself there)
    let progress = indicatif::ProgressBar::new(plan.header.weights.total_bytes).with_style(
        indicatif::ProgressStyle::with_template("uploading weights {bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for id in graph.leaves(&Op::Weight) {
        let n = graph.node(id);
        let e = plan.entry(&n.name).ok_or_else(|| gerr(format!("weight `{}` is not in the plan", n.name)))?;
        progress.inc(e.nbytes);
        let local: Vec<usize> = n.ty.shape.iter().map(|d| d.as_const().unwrap_or(0)).collect();
        let shard = plan.shard_for(e, &local, spec.rank, spec.world)?;
        let buf = match &e.seeded {
            None => match shard {
                None => cu(stream.clone_htod(plan.weight_bytes(e)), &format!("uploading {}", n.name))?,
                Some(s) => {
                    let d: dsc_ir::DType = e.dtype.parse().map_err(gerr)?;
                    let part = dsc_ir::shard::slice_bytes(d, &e.shape, s, plan.weight_bytes(e)).map_err(|m| gerr(format!("weight `{}`: {m}", n.name)))?;
                    cu(stream.clone_htod(&part), &format!("uploading {}", n.name))?
                }
            },
            Some(sw) => {
                // generate on the device (a shard reads its part of the full tensor's stream)
                let k = format!("seeded_init_{}", e.dtype);
                let f = module.load_function(&k).map_err(|_| gerr(format!("weight `{}`: seeded {} weights are not generated on the GPU (the plan has no `{k}` kernel)", n.name, e.dtype)))?;
                let numel: i64 = local.iter().product::<usize>() as i64;
                let d: dsc_ir::DType = e.dtype.parse().map_err(gerr)?;
                let nbytes = d.bytes_for(numel as usize).ok_or_else(|| gerr(format!("weight `{}`: {numel} {d} elements", n.name)))?;
                let buf = cu(stream.alloc_zeros::<u8>(nbytes), &format!("allocating {}", n.name))?;
                let (row0, len, stride, col0) = match shard {
                    Some(s) => dsc_ir::shard::seeded_layout(&e.shape, s),
                    None => (0, numel as u64, 0, 0),
                };
                let base = dsc_ir::seeded::base(sw.seed, &e.name).wrapping_add(row0) as i64;
                let scale = sw.scale.to_bits() as i64;
                let ones = sw.ones as i64;
                let (len, stride, col0) = (len as i64, stride as i64, col0 as i64);
                let mut lb = stream.launch_builder(&f);
                lb.arg(&buf).arg(&numel).arg(&base).arg(&scale).arg(&ones).arg(&len).arg(&stride).arg(&col0);
                let cfg = LaunchConfig { grid_dim: ((numel as u32).div_ceil(256), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
                // SAFETY: seeded_init_<dtype>(y, n, base, scale, ones) writes n elements of
                // the entry's dtype into `buf`, which holds exactly nbytes.
                unsafe { lb.launch(cfg) }.map_err(|e| gerr(format!("generating {}: {e:?}", n.name)))?;
                buf
            }
        };
        resident.insert(n.name.clone(), buf);
    }
    progress.finish_and_clear();
    Ok(resident)
}
