//! Multi-step decode on the GPU: k fed greedy steps of a bucket as one chained CUDA graph, in
//! two instances used in turn (see the `gpu` module's notes, "Multi-step decode").

use super::*;

/// k fed greedy steps of a bucket as one CUDA graph, in two instances used in turn (the host
/// stages one while the other may still run), chained: one input kernel first copies the k
/// steps' staged inputs into k copies of the packed span (`inputs`; the first step's tokens
/// from the other instance's last ids), step i's launches read copy i — its tokens straight
/// from step i - 1's id buffer — and its argmax (under PDL) writes id buffer i: no kernel
/// between one step's argmax and the next one's first kernel, fixed addresses, so the graph
/// replays them.
pub(super) struct Multi {
    k: usize,
    rows: usize,
    /// bytes of each id buffer ([`multi_ids_bytes`])
    idb: usize,
    insts: Vec<MultiInst>,
    turn: usize,
}

pub(super) struct MultiInst {
    graph: Option<cudarc::driver::CudaGraph>,
    /// the k steps' packed spans, one after another (pinned)
    staging: cudarc::driver::PinnedHostSlice<u8>,
    /// where the input kernel puts them: the k steps' inputs, at this offset of the arena
    inputs: usize,
    /// the k steps' token ids: arena offsets (`Multi::idb` bytes each) right after `inputs`
    ids: Vec<usize>,
    /// after the id copies of this instance's last launch
    copied: Option<cudarc::driver::CudaEvent>,
}

/// Multi-step launches for steps of at most this many rows: a graph launch is ~9 µs of a
/// 250 µs SmolLM2-shape b1 step (multi-step +4.2% with the argmax folded in), ~1% of its b8
/// step (+0.3% measured, b32 / b128 and the 8B shape neutral) — where each new bucket's two
/// captures would cost more than they save. Serving 64 SmolLM2-shape streams with multi-step
/// at every size: 25.2k -> 21.3k tok/s (the shrinking batch captured a pair of graphs per size;
/// bench/results/session20-2026-12-01.json).
pub(super) const MULTI_STEP_MAX_ROWS: usize = 4;

/// A bucket gets its multi-step graphs once its one-step graph has run this many times (a
/// shape in steady use, not one a shrinking batch passes through).
const MULTI_STEP_MIN_RUNS: usize = 8;

/// Bytes of a multi-step id buffer for `rows` logits rows: 256 ids at least, 256-byte aligned
/// (the copies to the host take rows · 4 of them; the size is part of the arena's room, whose
/// placement the b1 step is sensitive to — see `prepare`).
pub(super) fn multi_ids_bytes(rows: usize) -> usize {
    (rows.max(256) * 4).div_ceil(256) * 256
}

impl GpuBackend<'_> {
    /// [`Backend::launch_greedy_steps`] in the bucket: the k steps' inputs staged, the
    /// instance's graph launched (both instances captured at the first launch:
    /// [`GpuBackend::capture_multi`]), the k id buffers copied to `hosts` (taken from the
    /// vector only when launching) on the copy stream. None: the bucket cannot (no packed
    /// inputs or room, or not yet in steady use). Returns the instance and the k in-flight
    /// entries.
    pub(super) fn launch_multi(
        &self,
        bucket: &mut Bucket,
        bs: &[StepBatch],
        kname: &str,
        key: BucketKey,
        hosts: &mut Vec<cudarc::driver::PinnedHostSlice<u8>>,
    ) -> Result<Option<(usize, Vec<Inflight>)>> {
        let (k, rows) = (bs.len(), bs[0].logit_rows.len());
        let f = &self.inputs_kernel;
        if bucket.packed.is_empty() {
            return Ok(None);
        }
        // (a bucket in steady use only: its two graphs' captures cost milliseconds)
        if bucket.multi.is_none() && bucket.runs < MULTI_STEP_MIN_RUNS {
            return Ok(None);
        }
        let span = bucket.packed_span.1 - bucket.packed_span.0;
        let idb = multi_ids_bytes(rows);
        // (the arena's room for two instances of k copies and k id buffers)
        let Some((room_at, room)) = bucket.multi_at.filter(|&(_, n)| n >= 2 * k * (span + idb)) else { return Ok(None) };
        let mut m = match bucket.multi.take() {
            Some(m) if m.k == k && m.rows == rows => m,
            _ => {
                let mut insts = vec![];
                for inst in 0..2 {
                    let staging = self.pinned(k * span)?;
                    let inputs = room_at + inst * room / 2;
                    let ids = (0..k).map(|i| inputs + k * span + i * idb).collect();
                    insts.push(MultiInst { graph: None, staging, inputs, ids, copied: None });
                }
                Multi { k, rows, idb, insts, turn: 0 }
            }
        };
        let r = self.launch_multi_in(bucket, &mut m, bs, kname, key, std::mem::take(hosts), f, span);
        bucket.multi = Some(m);
        r.map(Some)
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_multi_in(
        &self,
        bucket: &mut Bucket,
        m: &mut Multi,
        bs: &[StepBatch],
        kname: &str,
        key: BucketKey,
        hosts: Vec<cudarc::driver::PinnedHostSlice<u8>>,
        f: &CudaFunction,
        span: usize,
    ) -> Result<(usize, Vec<Inflight>)> {
        let rows = m.rows;
        let j = m.turn;
        m.turn = 1 - j;
        // (this instance's last launch done: its staging and ids are free)
        if let Some(c) = m.insts[j].copied.take() {
            cu(c.synchronize(), "waiting for a multi-step graph's last run")?;
        }
        {
            let h = cu(m.insts[j].staging.as_mut_slice(), "staging inputs")?;
            for (i, b) in bs.iter().enumerate() {
                let table = self.padded_table(b);
                Self::pack_inputs(bucket, &Self::step_inputs(b, &table), &mut h[i * span..(i + 1) * span])?;
            }
        }
        // the first step's fed ids: the other instance's last buffer, where that instance ran
        // last; else copied there from where the last launch left them
        let other = 1 - j;
        if self.last_multi != Some((key, other)) {
            if let Some(c) = &m.insts[other].copied {
                cu(self.stream.wait(c), "ordering the fed ids after their copy")?;
            }
            let n = rows * 4;
            let arena = self.dev(&bucket.arena).0;
            let dst = arena + *m.insts[other].ids.last().expect("k ids") as u64;
            let src = match self.last_multi {
                Some((kk, jj)) if kk == key && jj == j => m.insts[j].ids.last().map(|&o| (arena + o as u64, m.idb)),
                Some(_) => self.multi_ids(),
                None => self.feeds[self.feed_at].as_ref().map(|f| self.dev(f)),
            };
            match src {
                Some((src, len)) if len >= n => self.dtod(dst, src, n)?,
                _ => return Err(gerr("a multi-step launch found no ids of the step before it")),
            }
        }
        // (both instances captured at the first launch: the second one's capture would
        // otherwise fall into the decode after a warm-up of one launch)
        for inst in [j, other] {
            if m.insts[inst].graph.is_none() {
                m.insts[inst].graph = self.capture_multi(bucket, m, inst, kname, f, span)?;
            }
        }
        match &m.insts[j].graph {
            Some(gr) => cu(gr.launch(), "multi-step graph launch")?,
            None => return Err(gerr("a multi-step graph was not captured")),
        }
        let copy = self.ids_copy_stream()?;
        let arena = self.dev(&bucket.arena).0;
        let mut entries = vec![];
        for (i, mut host) in hosts.into_iter().enumerate() {
            let h = &mut cu(host.as_mut_slice(), "reading token ids")?[..rows * 4];
            // SAFETY: `h` is pinned (the copy is asynchronous) and stays alive in the in-flight
            // entry until its event has completed; the id buffer holds `idb` >= rows·4 bytes
            cu(unsafe { cudarc::driver::result::memcpy_dtoh_async(h, arena + m.insts[j].ids[i] as u64, copy.cu_stream()) }, "reading token ids")?;
            let done = cu(copy.record_event(None), "recording an ids copy")?;
            entries.push(Inflight { host, rows, done, buf: 2 });
        }
        m.insts[j].copied = Some(cu(copy.record_event(None), "recording the ids copies")?);
        Ok((j, entries))
    }

    /// Capture multi-step instance `j` of `m`: the input kernel (the k staged spans into the
    /// instance's k copies in the arena, the first step's tokens from the other instance's
    /// last ids), then per step i its launches on copy i (tokens from step i - 1's ids) and
    /// the argmax into id buffer i, under PDL.
    fn capture_multi(&self, bucket: &mut Bucket, m: &Multi, j: usize, kname: &str, f: &CudaFunction, span: usize) -> Result<Option<cudarc::driver::CudaGraph>> {
        use cudarc::driver::DevicePtr;
        let (k, rows) = (m.k, m.rows);
        // (the staging buffer's address first: touching a pinned buffer synchronizes, which a
        // capturing stream does not allow)
        let src = cu(m.insts[j].staging.as_slice(), "staging inputs")?.as_ptr() as u64;
        let arena = bucket.arena.device_ptr(&self.stream).0;
        let inputs = arena + m.insts[j].inputs as u64;
        let id = |inst: usize, i: usize| arena + m.insts[inst].ids[i] as u64;
        let s0 = bucket.packed_span.0;
        // (the logits step's argmax folded in: its partials (8 bytes per block and row) and
        // counters)
        let fold_cfg = bucket.launches.iter().find_map(|a| match a {
            Action::Launch(l) if l.argmax.is_some() => Some(l.cfg),
            _ => None,
        });
        if let (Some(c), None) = (fold_cfg, &bucket.fold) {
            let (blocks, rows) = (c.grid_dim.0 as usize, c.grid_dim.1 as usize);
            bucket.fold =
                Some((cu(self.stream.alloc_zeros::<u8>(blocks * rows * 8), "allocating argmax partials")?, cu(self.stream.alloc_zeros::<u8>(rows.max(64) * 4), "allocating argmax counters")?));
        }
        let fold = fold_cfg.and(bucket.fold.as_ref()).map(|(p, c)| (self.dev(p).0, self.dev(c).0));
        cu(self.stream.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture")?;
        let fed = id(1 - j, k - 1);
        let mut launched = self.launch_inputs_to(f, bucket, src, inputs, k * span, Some((fed, rows)));
        for i in 0..k {
            if launched.is_err() {
                break;
            }
            // (step i's inputs: copy i of the span; its tokens the ids of step i - 1)
            let mut over: HashMap<&'static str, u64> = bucket.packed.iter().map(|&(name, o, _)| (name, inputs + (i * span + o - s0) as u64)).collect();
            if i > 0 {
                over.insert("tokens", id(j, i - 1));
            }
            if let Some((part, sync)) = fold {
                over.extend([("@apart", part), ("@async", sync), ("@aids", id(j, i))]);
            }
            launched = match self.launch_all_over(bucket, Some(&over)) {
                Ok(true) => Ok(()),
                Ok(false) => self.launch_argmax(bucket, kname, (id(j, i), m.idb), bucket.pdl),
                Err(e) => Err(e),
            };
        }
        let graph = cu(self.stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH), "end capture")?;
        launched?;
        Ok(graph)
    }

    /// The id buffer the last pipelined launch's last step wrote, when that was a multi-step
    /// launch of a bucket in the map (not the one now running, which is taken out of it).
    pub(super) fn multi_ids(&self) -> Option<(u64, usize)> {
        let (key, j) = self.last_multi?;
        let b = self.buckets.get(&key)?;
        let m = b.multi.as_ref()?;
        Some((self.dev(&b.arena).0 + *m.insts.get(j)?.ids.last()? as u64, m.idb))
    }
}
