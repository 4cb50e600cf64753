//! `engine::Backend` for the GPU backend: steps, greedy steps (pipelined and multi-step), the
//! KV pool's blocks, what the scheduler asks of a device.

use super::*;

impl Backend for GpuBackend<'_> {
    fn step(&mut self, b: &StepBatch) -> Result<Vec<Vec<f32>>> {
        self.no_inflight()?;
        self.with_bucket(b, |g, bucket, graphs| g.run_bucket(bucket, b, graphs))
    }

    fn step_greedy(&mut self, b: &StepBatch) -> Result<Vec<u32>> {
        self.no_inflight()?;
        self.with_bucket(b, |g, bucket, graphs| g.run_bucket_greedy(bucket, b, graphs))
    }

    fn launch_greedy(&mut self, b: &StepBatch, fed: bool) -> Result<bool> {
        // (the device argmax of a block per row; host reductions would serialize anyway)
        let Some(k) = self.greedy_argmax() else {
            return Ok(false);
        };
        if fed && self.last_multi.is_some() {
            // (the last launch was a multi-step one: its last ids into the fed buffer first,
            // once that buffer's own copy to the host has run)
            let rows = b.logit_rows.len();
            let at = self.feed_at;
            for f in self.inflight.iter().filter(|f| f.buf == at) {
                cu(self.stream.wait(&f.done), "ordering the fed ids after their copy")?;
            }
            if self.feeds[at].as_ref().is_none_or(|f| f.len() < rows * 4) {
                self.feeds[at] = Some(cu(self.stream.alloc_zeros::<u8>(rows.max(256) * 4), "allocating token ids")?);
            }
            let dst = self.dev(self.feeds[at].as_ref().expect("allocated above")).0;
            match self.multi_ids() {
                Some((src, len)) if len >= rows * 4 => self.dtod(dst, src, rows * 4)?,
                _ => return Err(gerr("the last multi-step launch's ids are gone")),
            }
        }
        self.last_multi = None;
        let rows = b.logit_rows.len();
        if b.tokens.len() != rows {
            return Err(gerr("a pipelined step has one token and one logits row per sequence"));
        }
        if rows > self.cached_max_tokens {
            // (a transient bucket's buffers go when the call returns: run those synchronously)
            if fed {
                return Err(gerr("a fed step has more rows than a cached bucket holds"));
            }
            return Ok(false);
        }
        if fed && self.inflight.is_empty() {
            return Err(gerr("a fed step needs a launched step before it"));
        }
        // the ids buffers, two in turn: a fed step reads the last step's, its argmax writes the
        // other — once that one's copy to the host (of the step before last) has run
        let (prev, cur) = (self.feed_at, 1 - self.feed_at);
        if fed && self.feeds[prev].as_ref().is_none_or(|f| f.len() < rows * 4) {
            return Err(gerr("a fed step has more rows than the step before it"));
        }
        if self.feeds[cur].as_ref().is_none_or(|f| f.len() < rows * 4) {
            self.feeds[cur] = Some(cu(self.stream.alloc_zeros::<u8>(rows.max(256) * 4), "allocating token ids")?);
        }
        for f in self.inflight.iter().filter(|f| f.buf == cur) {
            // (in practice long done: the engine collects a step before launching two more)
            cu(self.stream.wait(&f.done), "ordering the token ids' reuse after their copy")?;
        }
        let ids = self.feeds[cur].take().expect("allocated above");
        let src = if fed { self.feeds[prev].take() } else { None };
        let r = self.with_bucket(b, |g, bucket, graphs| g.launch_bucket_greedy(bucket, b, graphs, &k, &ids, src.as_ref()));
        self.feeds[cur] = Some(ids);
        if src.is_some() {
            self.feeds[prev] = src;
        }
        r?;
        self.feed_at = cur;
        let mut host = match self.spare_ids.pop() {
            Some(h) if h.len() >= rows * 4 => h,
            _ => self.pinned(rows.max(256) * 4)?,
        };
        let ids = self.feeds[cur].as_ref().expect("set above");
        let copy = self.ids_copy_stream()?;
        cu(copy.memcpy_dtoh(&ids.slice(0..rows * 4), &mut host), "reading token ids")?;
        let done = cu(copy.record_event(None), "recording the ids copy")?;
        self.inflight.push_back(Inflight { host, rows, done, buf: cur });
        Ok(true)
    }

    fn launch_greedy_steps(&mut self, bs: &[StepBatch]) -> Result<bool> {
        let k = bs.len();
        let Some(kname) = self.greedy_argmax() else { return Ok(false) };
        if k < 2 || self.inflight.is_empty() {
            return Ok(false);
        }
        let rows = bs[0].logit_rows.len();
        if rows > self.greedy_steps_rows() || bs.iter().any(|b| b.tokens.len() != rows || b.logit_rows.len() != rows || b.num_seqs != bs[0].num_seqs) {
            return Ok(false);
        }
        // (all k steps in one bucket: one context class)
        let key = self.bucket_key(&bs[0]).0;
        if bs.iter().any(|b| self.bucket_key(b).0 != key) {
            return Ok(false);
        }
        let mut hosts = vec![];
        for _ in 0..k {
            hosts.push(match self.spare_ids.pop() {
                Some(h) if h.len() >= rows * 4 => h,
                _ => self.pinned(rows.max(256) * 4)?,
            });
        }
        let r = self.with_bucket(&bs[0], |g, bucket, _| g.launch_multi(bucket, bs, &kname, key, &mut hosts));
        // (the pinned buffers a launch did not take go back: not allocated anew next step)
        self.spare_ids.extend(hosts);
        match r? {
            Some((j, entries)) => {
                self.inflight.extend(entries);
                self.last_multi = Some((key, j));
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn greedy_steps_rows(&self) -> usize {
        // (graphs, the input kernel and the device argmax; one GPU: a tensor-parallel rank's
        // all-reduces stay out of multi-step graphs)
        let can = self.greedy_argmax().is_some() && self.use_graphs && matches!(self.collective, GpuCollective::Single);
        if can {
            self.cached_max_tokens.min(MULTI_STEP_MAX_ROWS)
        } else {
            0
        }
    }

    fn collect_greedy(&mut self) -> Result<Vec<u32>> {
        let Inflight { host, rows, done, .. } = self.inflight.pop_front().ok_or_else(|| gerr("collect_greedy: no pipelined step in flight"))?;
        cu(done.synchronize(), "waiting for a pipelined step")?;
        let ids = cu(host.as_slice(), "reading token ids")?[..rows * 4].chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32).collect();
        self.spare_ids.push(host);
        Ok(ids)
    }

    fn discard_inflight(&mut self) {
        while let Some(Inflight { host, .. }) = self.inflight.pop_front() {
            self.spare_ids.push(host);
        }
    }

    fn kv_geometry(&self) -> (usize, usize) {
        (self.blocks, self.block_size)
    }

    fn moe_layout(&self) -> Option<(Vec<usize>, usize)> {
        self.moe.as_ref().map(crate::engine::MoeState::layout)
    }

    fn set_expert(&mut self, layer: usize, expert: usize, enabled: bool) -> Result<()> {
        let Some(m) = &mut self.moe else { return Err(crate::RuntimeError::Request(format!("expert {expert} of layer {layer}: this plan has no routed experts"))) };
        let at = m.set(layer, expert, enabled)?;
        let v = m.mask()[at].to_le_bytes();
        let buf = self.resident.get_mut("expert_mask").ok_or_else(|| gerr("the expert mask is not resident"))?;
        // (on the backend's stream: the steps after it read the new mask)
        let mut view = buf.slice_mut(4 * at..4 * at + 4);
        self.stream.memcpy_htod(&v, &mut view).map_err(|e| gerr(format!("updating the expert mask: {e:?}")))?;
        Ok(())
    }

    fn moe_stats(&self) -> Option<crate::engine::MoeStats> {
        let mut s = self.moe.as_ref().map(crate::engine::MoeState::stats)?;
        // the routers' selections from the device (`expert_mask@counts`), at most every
        // MOE_COUNTS_EVERY; a failed read leaves the last counts (the metrics lag, nothing
        // else depends on them)
        let mut last = self.moe_counts.lock().unwrap_or_else(|p| p.into_inner());
        let stale = last.as_ref().is_none_or(|(at, _)| at.elapsed() >= super::MOE_COUNTS_EVERY);
        if stale {
            if let Some(buf) = self.resident.get("expert_mask@counts") {
                match self.stream.clone_dtoh(buf) {
                    Ok(bytes) => *last = Some((std::time::Instant::now(), bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64).collect())),
                    Err(e) => tracing::warn!(target: "dsc::gpu", "reading the routed-token counters: {e:?}"),
                }
            }
        }
        if let Some((_, counts)) = last.as_ref().filter(|(_, c)| c.len() == s.tokens.len()) {
            s.tokens.clone_from(counts);
        }
        Some(s)
    }

    fn reset(&mut self) {
        // stale KV rows are never read: attention only reads positions a sequence has written
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        use cudarc::driver::DevicePtr;
        let g = self.graph;
        for id in g.leaves(&Op::State) {
            let n = g.node(id);
            let buf = &self.resident[&n.name];
            let per_block = buf.len() / self.blocks;
            let (base, _sync) = buf.device_ptr(&self.stream);
            for &(src, dst) in pairs {
                if (src.max(dst) as usize) >= self.blocks {
                    return Err(gerr(format!("block copy {src} -> {dst} outside the pool of {}", self.blocks)));
                }
                // SAFETY: both ranges lie inside the pool (checked above) and do not overlap
                // (distinct blocks); ordered on this backend's stream like every launch.
                unsafe { cudarc::driver::result::memcpy_dtod_async(base + (dst as usize * per_block) as u64, base + (src as usize * per_block) as u64, per_block, self.stream.cu_stream()) }
                    .map_err(|e| gerr(format!("copying KV block: {e:?}")))?;
            }
        }
        Ok(())
    }
}
