//! Tensor parallelism: one thread per rank, in lock step. The scheduler (whoever calls
//! [`Backend::step`]) stays on the calling thread; every step batch goes to every rank, each
//! rank runs the same partitioned graph on its slice of the weights, and the ranks meet at
//! the graph's `all_reduce` nodes (NCCL between GPUs; a barrier + sum on the CPU backend or
//! when every rank shares one GPU). Rank 0's logits are the answer (all ranks compute the
//! same ones: the LM head is replicated).

use crate::engine::{Backend, CpuBackend, StepBatch};
use crate::error::{Result, RuntimeError};
use crate::gpu::{GpuBackend, GpuCollective, RankSpec};
use crate::plan::Plan;
use dsc_ir::{Graph, ThreadGroup};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

enum Msg {
    Step(Arc<StepBatch>),
    Copy(Arc<Vec<(u32, u32)>>),
    Reset,
}

type Reply = Result<Vec<Vec<f32>>>;

/// The calling thread's handle on the rank threads.
pub struct Ranks {
    txs: Vec<Sender<Msg>>,
    rxs: Vec<Receiver<Reply>>,
    geometry: (usize, usize),
}

impl Backend for Ranks {
    fn step(&mut self, batch: &StepBatch) -> Result<Vec<Vec<f32>>> {
        batch.validate()?;
        let b = Arc::new(batch.clone());
        for tx in &self.txs {
            tx.send(Msg::Step(b.clone())).map_err(|_| RuntimeError::Gpu("a rank thread has exited".into()))?;
        }
        let mut first = None;
        for (r, rx) in self.rxs.iter().enumerate() {
            let out = rx.recv().map_err(|_| RuntimeError::Gpu(format!("rank {r} exited during a step")))?;
            let out = out.map_err(|e| RuntimeError::Gpu(format!("rank {r}: {e}")))?;
            if r == 0 {
                first = Some(out);
            }
        }
        first.ok_or_else(|| RuntimeError::Gpu("no ranks".into()))
    }

    fn kv_geometry(&self) -> (usize, usize) {
        self.geometry
    }

    fn reset(&mut self) {
        for tx in &self.txs {
            let _ = tx.send(Msg::Reset);
        }
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        let p = Arc::new(pairs.to_vec());
        for tx in &self.txs {
            tx.send(Msg::Copy(p.clone())).map_err(|_| RuntimeError::Gpu("a rank thread has exited".into()))?;
        }
        for (r, rx) in self.rxs.iter().enumerate() {
            rx.recv().map_err(|_| RuntimeError::Gpu(format!("rank {r} exited")))?.map_err(|e| RuntimeError::Gpu(format!("rank {r}: {e}")))?;
        }
        Ok(())
    }
}

/// Run `f` with a backend made of `world` rank threads; `make(rank)` builds each rank's
/// backend on its own thread (CUDA contexts and NCCL communicators are per thread).
pub fn with_ranks<B, R>(world: usize, make: impl Fn(usize) -> Result<B> + Sync, f: impl FnOnce(&mut Ranks) -> Result<R>) -> Result<R>
where
    B: Backend,
{
    std::thread::scope(|s| {
        let mut txs = vec![];
        let mut rxs = vec![];
        let (ready_tx, ready_rx) = channel::<(usize, Result<(usize, usize)>)>();
        for rank in 0..world {
            let (tx, rx) = channel::<Msg>();
            let (otx, orx) = channel::<Reply>();
            txs.push(tx);
            rxs.push(orx);
            let (make, ready_tx) = (&make, ready_tx.clone());
            s.spawn(move || {
                let mut b = match make(rank) {
                    Ok(b) => {
                        let _ = ready_tx.send((rank, Ok(b.kv_geometry())));
                        b
                    }
                    Err(e) => {
                        let _ = ready_tx.send((rank, Err(e)));
                        return;
                    }
                };
                while let Ok(m) = rx.recv() {
                    match m {
                        Msg::Step(batch) => {
                            if otx.send(b.step(&batch)).is_err() {
                                return;
                            }
                        }
                        Msg::Copy(pairs) => {
                            if otx.send(b.copy_blocks(&pairs).map(|_| vec![])).is_err() {
                                return;
                            }
                        }
                        Msg::Reset => b.reset(),
                    }
                }
            });
        }
        drop(ready_tx);
        let mut geometry = None;
        let mut failed = None;
        for _ in 0..world {
            match ready_rx.recv() {
                Ok((_, Ok(g))) => geometry = Some(g),
                Ok((r, Err(e))) => failed = Some(RuntimeError::Gpu(format!("starting rank {r}: {e}"))),
                Err(_) => failed = Some(RuntimeError::Gpu("a rank thread died while starting".into())),
            }
        }
        let mut ranks = Ranks { txs, rxs, geometry: geometry.unwrap_or((0, 0)) };
        let out = match failed {
            Some(e) => Err(e),
            None => f(&mut ranks),
        };
        // closing the channels ends the rank threads; the scope joins them
        drop(ranks);
        out
    })
}

/// Every rank on the CPU backend (threads meeting at a barrier to sum).
pub fn cpu<R>(graph: &Graph, plan: &Plan, kv_tokens: usize, f: impl FnOnce(&mut Ranks) -> Result<R>) -> Result<R> {
    let world = plan.header.tensor_parallel;
    let group = ThreadGroup::new(world);
    with_ranks(world, |r| CpuBackend::new_rank(graph, plan, kv_tokens, r, world, group.handle(r)), f)
}

/// How GPU ranks meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuMode {
    /// rank r on GPU r, all-reduce through NCCL
    Nccl,
    /// every rank on GPU 0, all-reduce by local copies (checks a partition on one GPU)
    Local,
}

impl GpuMode {
    /// `RuntimeOptions::tp_local`: every rank on GPU 0
    pub fn of(opts: &crate::options::RuntimeOptions) -> Self {
        if opts.tp_local {
            GpuMode::Local
        } else {
            GpuMode::Nccl
        }
    }
}

/// Every rank on a GPU.
pub fn gpu<R>(graph: &Graph, plan: &Plan, kv_tokens: usize, mode: GpuMode, opts: &crate::options::RuntimeOptions, f: impl FnOnce(&mut Ranks) -> Result<R>) -> Result<R> {
    let world = plan.header.tensor_parallel;
    let group = ThreadGroup::new(world);
    let id = if mode == GpuMode::Nccl && world > 1 {
        // SAFETY: only probes whether the shared library can be opened
        if !unsafe { cudarc::nccl::sys::is_culib_present() } {
            return Err(RuntimeError::Gpu("NCCL (libnccl.so) was not found; put its folder on LD_LIBRARY_PATH (pip: nvidia-nccl-cu13 ships it)".into()));
        }
        // NVLink multicast (NVLS) can take a shared host's GPUs down; keep it off
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            return Err(RuntimeError::Gpu("set NCCL_NVLS_ENABLE=0 before running tensor-parallel plans on this host".into()));
        }
        Some(cudarc::nccl::Id::new().map_err(|e| RuntimeError::Gpu(format!("NCCL unique id: {e:?}")))?)
    } else {
        None
    };
    with_ranks(
        world,
        |rank| {
            let device = if mode == GpuMode::Nccl { rank } else { 0 };
            GpuBackend::new_rank(graph, plan, kv_tokens, opts, RankSpec { device, rank, world }, |stream| {
                Ok(match (mode, world, id) {
                    (_, 1, _) => GpuCollective::Single,
                    (GpuMode::Local, _, _) => GpuCollective::Local(group.handle(rank)),
                    (GpuMode::Nccl, _, Some(id)) => {
                        stream.context().bind_to_thread().map_err(|e| RuntimeError::Gpu(format!("binding GPU {device}: {e:?}")))?;
                        GpuCollective::Nccl(cudarc::nccl::Comm::from_rank(stream.clone(), rank, world, id).map_err(|e| RuntimeError::Gpu(format!("NCCL communicator for rank {rank}: {e:?}")))?)
                    }
                    (GpuMode::Nccl, _, None) => {
                        unreachable!("an id is made for NCCL groups above")
                    }
                })
            })
        },
        f,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend that records what it was asked (to check the dispatcher itself).
    struct Echo(usize);
    impl Backend for Echo {
        fn step(&mut self, b: &StepBatch) -> Result<Vec<Vec<f32>>> {
            Ok(vec![vec![self.0 as f32, b.tokens.len() as f32]])
        }
        fn kv_geometry(&self) -> (usize, usize) {
            (4, 16)
        }
        fn reset(&mut self) {}
        fn copy_blocks(&mut self, _: &[(u32, u32)]) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_rank_steps_and_rank_zero_answers() {
        let b = StepBatch { tokens: vec![1, 2, 3], positions: vec![0, 1, 2], seq_ids: vec![0; 3], slots: vec![0, 1, 2], block_table: vec![0], num_seqs: 1, max_blocks: 1, logit_rows: vec![2] };
        let out = with_ranks(
            3,
            |r| Ok(Echo(r)),
            |ranks| {
                assert_eq!(ranks.kv_geometry(), (4, 16));
                ranks.step(&b)
            },
        )
        .unwrap();
        assert_eq!(out, vec![vec![0.0, 3.0]]);
        let err = with_ranks(
            2,
            |r| {
                if r == 1 {
                    Err(RuntimeError::Gpu("no device".into()))
                } else {
                    Ok(Echo(r))
                }
            },
            |ranks| ranks.step(&b),
        )
        .unwrap_err();
        assert!(err.to_string().contains("starting rank 1"), "{err}");
    }
}
