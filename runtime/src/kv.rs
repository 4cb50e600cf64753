//! The KV-cache block manager: fixed-size blocks of one pool shared by every sequence
//! (PagedAttention, Kwon et al. 2023), with
//! - per-sequence block tables and reference counts (sequences that fork share blocks;
//!   writing into a shared, partly filled block copies it first: copy-on-write),
//! - prefix caching: a full block is keyed by a hash of its tokens chained with the hash of
//!   the prefix before it, so a new sequence with the same prefix reuses its blocks,
//! - LRU eviction of cached blocks no sequence holds (they stay reusable until the space is
//!   needed), and statistics.
//!
//! The manager only does the bookkeeping; the caller writes KV rows (through the step's slot
//! mapping) and performs the block copies it returns.

use std::collections::{BTreeMap, HashMap, VecDeque};

pub type BlockId = u32;

/// A sequence's blocks and how many of its tokens they hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqBlocks {
    pub blocks: Vec<BlockId>,
    /// chained hashes of the full blocks registered so far (prefix of `blocks`)
    hashes: Vec<u64>,
}

impl SeqBlocks {
    /// Tokens the blocks can hold.
    pub fn capacity(&self, block_size: usize) -> usize {
        self.blocks.len() * block_size
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvStats {
    pub total_blocks: usize,
    /// held by at least one sequence
    pub used_blocks: usize,
    /// held by none but kept for the prefix cache (evictable)
    pub cached_blocks: usize,
    /// never used or evicted
    pub free_blocks: usize,
    /// prompt tokens looked up in / found in the prefix cache
    pub prefix_query_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub evictions: u64,
    pub cow_copies: u64,
}

/// Not enough free (or evictable) blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfBlocks;

pub struct BlockManager {
    block_size: usize,
    refs: Vec<u32>,
    free: VecDeque<BlockId>,
    /// the prefix-cache key a block is registered under
    key: Vec<Option<u64>>,
    cache: HashMap<u64, BlockId>,
    /// cached blocks with no holder, by last release (oldest first)
    lru: BTreeMap<u64, BlockId>,
    lru_tick: Vec<u64>,
    tick: u64,
    prefix_caching: bool,
    stats: KvStats,
}

/// Chain a block's tokens onto the hash of the prefix before it (FNV-1a over the ids).
fn chain(prev: u64, tokens: &[u32]) -> u64 {
    let mut h = prev ^ 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        for b in t.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x1000_0000_01b3);
        }
    }
    // a block's key also depends on its length (always block_size here) and position
    h ^ (tokens.len() as u64).rotate_left(32)
}

impl BlockManager {
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        BlockManager {
            block_size,
            refs: vec![0; num_blocks],
            free: (0..num_blocks).map(|b| b as BlockId).collect(),
            key: vec![None; num_blocks],
            cache: HashMap::new(),
            lru: BTreeMap::new(),
            lru_tick: vec![0; num_blocks],
            tick: 0,
            prefix_caching,
            stats: KvStats { total_blocks: num_blocks, ..Default::default() },
        }
    }

    /// Hand out free blocks from `first` on, then wrap (`MeasureOptions::kv_first_block`: where
    /// a sequence's blocks lie in the pools, a measurement knob). Before any block is taken.
    pub fn starting_at(mut self, first: usize) -> Self {
        let n = self.free.len();
        if n > 0 {
            self.free.rotate_left(first % n);
        }
        self
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks that could be handed out now (free + evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    pub fn stats(&self) -> KvStats {
        let mut s = self.stats.clone();
        s.free_blocks = self.free.len();
        s.cached_blocks = self.lru.len();
        // every block is held, free or cached (`check` verifies it): no scan of the pool
        s.used_blocks = self.refs.len() - self.free.len() - self.lru.len();
        s
    }

    fn take(&mut self, b: BlockId) {
        if self.refs[b as usize] == 0 {
            if let Some(k) = self.key[b as usize] {
                if self.cache.get(&k) == Some(&b) {
                    self.lru.remove(&self.lru_tick[b as usize]);
                }
            }
        }
        self.refs[b as usize] += 1;
    }

    fn alloc(&mut self) -> Result<BlockId, OutOfBlocks> {
        let b = match self.free.pop_front() {
            Some(b) => b,
            None => {
                // evict the least recently released cached block
                let (&t, &b) = self.lru.iter().next().ok_or(OutOfBlocks)?;
                self.lru.remove(&t);
                if let Some(k) = self.key[b as usize].take() {
                    self.cache.remove(&k);
                }
                self.stats.evictions += 1;
                b
            }
        };
        self.key[b as usize] = None;
        self.refs[b as usize] = 1;
        Ok(b)
    }

    fn release_block(&mut self, b: BlockId) {
        let r = &mut self.refs[b as usize];
        debug_assert!(*r > 0, "block {b} released more often than taken");
        *r -= 1;
        if *r > 0 {
            return;
        }
        match self.key[b as usize] {
            Some(k) if self.cache.get(&k) == Some(&b) => {
                self.tick += 1;
                self.lru_tick[b as usize] = self.tick;
                self.lru.insert(self.tick, b);
            }
            _ => {
                self.key[b as usize] = None;
                self.free.push_back(b);
            }
        }
    }

    /// Start a sequence with prompt `tokens`: reuse cached blocks of its longest cached
    /// prefix. Returns the blocks and how many tokens they already hold (always fewer than
    /// the prompt: the last prompt token is computed again to get its logits).
    pub fn start(&mut self, tokens: &[u32]) -> (SeqBlocks, usize) {
        let mut s = SeqBlocks::default();
        if !self.prefix_caching {
            return (s, 0);
        }
        let bs = self.block_size;
        let full = tokens.len().saturating_sub(1) / bs;
        self.stats.prefix_query_tokens += (full * bs) as u64;
        let mut h = 0u64;
        for i in 0..full {
            h = chain(h, &tokens[i * bs..(i + 1) * bs]);
            match self.cache.get(&h).copied() {
                Some(b) => {
                    self.take(b);
                    s.blocks.push(b);
                    s.hashes.push(h);
                }
                None => break,
            }
        }
        let hit = s.blocks.len() * bs;
        self.stats.prefix_hit_tokens += hit as u64;
        (s, hit)
    }

    /// Make room for tokens up to `upto` (exclusive) where the next write starts at token
    /// `from`. Returns block copies (src, dst) to do before the write (copy-on-write of a
    /// shared, partly filled block). On failure nothing changed.
    pub fn grow(&mut self, s: &mut SeqBlocks, from: usize, upto: usize) -> Result<Vec<(BlockId, BlockId)>, OutOfBlocks> {
        let bs = self.block_size;
        let need_new = upto.div_ceil(bs).saturating_sub(s.blocks.len());
        // existing blocks the write lands in that another sequence also holds
        let shared: Vec<usize> = (from / bs..upto.div_ceil(bs).min(s.blocks.len())).filter(|&i| self.refs[s.blocks[i] as usize] > 1).collect();
        if need_new + shared.len() > self.available() {
            return Err(OutOfBlocks);
        }
        let mut copies = vec![];
        for i in shared {
            let old = s.blocks[i];
            let new = self.alloc()?;
            self.release_block(old);
            s.blocks[i] = new;
            s.hashes.truncate(i);
            copies.push((old, new));
            self.stats.cow_copies += 1;
        }
        for _ in 0..need_new {
            let b = self.alloc()?;
            s.blocks.push(b);
        }
        Ok(copies)
    }

    /// Register the sequence's newly filled blocks in the prefix cache; `tokens` are all the
    /// tokens whose KV is written (the sequence's computed prefix).
    pub fn commit(&mut self, s: &mut SeqBlocks, tokens: &[u32]) {
        if !self.prefix_caching {
            return;
        }
        let bs = self.block_size;
        let full = (tokens.len() / bs).min(s.blocks.len());
        while s.hashes.len() < full {
            let i = s.hashes.len();
            let prev = if i == 0 { 0 } else { s.hashes[i - 1] };
            let h = chain(prev, &tokens[i * bs..(i + 1) * bs]);
            s.hashes.push(h);
            let b = s.blocks[i];
            if self.key[b as usize].is_none() && !self.cache.contains_key(&h) {
                self.key[b as usize] = Some(h);
                self.cache.insert(h, b);
            }
        }
    }

    /// A second sequence sharing every block of `s` (n > 1 sampling, beam search).
    pub fn fork(&mut self, s: &SeqBlocks) -> SeqBlocks {
        for &b in &s.blocks {
            self.take(b);
        }
        s.clone()
    }

    /// The sequence is done (or preempted): its blocks go back (cached ones stay reusable).
    pub fn release(&mut self, s: SeqBlocks) {
        for b in s.blocks.into_iter().rev() {
            self.release_block(b);
        }
    }

    /// Check the bookkeeping against the block tables of every live sequence (for tests).
    pub fn check(&self, live: &[&SeqBlocks]) -> Result<(), String> {
        let mut count = vec![0u32; self.refs.len()];
        for s in live {
            for &b in &s.blocks {
                count[b as usize] += 1;
            }
        }
        if count != self.refs {
            return Err(format!("refcounts {:?} but the sequences hold {:?}", self.refs, count));
        }
        let mut seen = vec![false; self.refs.len()];
        for &b in self.free.iter().chain(self.lru.values()) {
            if seen[b as usize] || self.refs[b as usize] != 0 {
                return Err(format!("block {b} is free twice or free while held"));
            }
            seen[b as usize] = true;
        }
        let held = self.refs.iter().filter(|&&r| r > 0).count();
        if held + self.free.len() + self.lru.len() != self.refs.len() {
            return Err(format!("{held} held + {} free + {} cached != {} blocks (leak)", self.free.len(), self.lru.len(), self.refs.len()));
        }
        for (&k, &b) in &self.cache {
            if self.key[b as usize] != Some(k) {
                return Err(format!("cache entry for block {b} does not match its key"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn prefix_blocks_are_shared_and_survive_release() {
        let mut m = BlockManager::new(8, 4, true);
        let prompt: Vec<u32> = (0..10).collect();
        let (mut a, hit) = m.start(&prompt);
        assert_eq!(hit, 0);
        m.grow(&mut a, 0, 10).unwrap();
        m.commit(&mut a, &prompt);
        assert_eq!(a.blocks.len(), 3);
        // same 8-token prefix: two full blocks reused
        let (b, hit) = m.start(&prompt);
        assert_eq!((hit, b.blocks.len()), (8, 2));
        assert_eq!(&b.blocks[..], &a.blocks[..2]);
        m.check(&[&a, &b]).unwrap();
        m.release(a);
        m.release(b);
        let st = m.stats();
        assert_eq!((st.used_blocks, st.cached_blocks, st.free_blocks), (0, 2, 6));
        // still cached after both are gone
        let (c, hit) = m.start(&prompt);
        assert_eq!(hit, 8);
        m.check(&[&c]).unwrap();
        m.release(c);
        // pressure evicts cached blocks, oldest first
        let mut d = SeqBlocks::default();
        m.grow(&mut d, 0, 32).unwrap();
        assert_eq!(m.stats().evictions, 2);
        assert_eq!(m.start(&prompt).1, 0);
        assert_eq!(m.grow(&mut d, 32, 33), Err(OutOfBlocks));
    }

    #[test]
    fn fork_then_write_copies_the_shared_partial_block() {
        let mut m = BlockManager::new(8, 4, true);
        let prompt: Vec<u32> = (0..6).collect();
        let (mut a, _) = m.start(&prompt);
        m.grow(&mut a, 0, 6).unwrap();
        m.commit(&mut a, &prompt);
        let mut b = m.fork(&a);
        // both append token 6 into block 1 (shared, 2 of 4 rows used): the first writer copies
        let copies = m.grow(&mut b, 6, 7).unwrap();
        assert_eq!(copies, vec![(a.blocks[1], b.blocks[1])]);
        assert_ne!(a.blocks[1], b.blocks[1]);
        assert_eq!(a.blocks[0], b.blocks[0], "full blocks stay shared");
        // now block 1 of `a` is no longer shared: no copy
        assert!(m.grow(&mut a, 6, 7).unwrap().is_empty());
        m.check(&[&a, &b]).unwrap();
        assert_eq!(m.stats().cow_copies, 1);
    }

    #[derive(Clone, Debug)]
    enum Act {
        Start(u8, u8),
        Grow(usize, u8),
        Fork(usize),
        Release(usize),
    }

    fn act() -> impl Strategy<Value = Act> {
        prop_oneof![(0u8..3, 1u8..20).prop_map(|(p, n)| Act::Start(p, n)), (0usize..8, 1u8..6).prop_map(|(i, n)| Act::Grow(i, n)), (0usize..8).prop_map(Act::Fork), (0usize..8).prop_map(Act::Release),]
    }

    proptest! {
        /// Any interleaving of starts (with shared prefixes), growth, forks and releases keeps
        /// refcounts equal to the block tables, never shares a block wrongly, never leaks, and
        /// a sequence's blocks always cover its tokens.
        #[test]
        fn bookkeeping_holds_under_any_interleaving(acts in proptest::collection::vec(act(), 1..80), blocks in 4usize..24) {
            let mut m = BlockManager::new(blocks, 4, true);
            // (blocks, tokens written)
            let mut live: Vec<(SeqBlocks, Vec<u32>)> = vec![];
            for a in acts {
                match a {
                    Act::Start(p, n) => {
                        // three prompt families share prefixes
                        let toks: Vec<u32> = (0..n as u32).map(|i| i + 100 * p as u32).collect();
                        let (mut s, hit) = m.start(&toks);
                        prop_assert!(hit < toks.len() && hit % 4 == 0);
                        if m.grow(&mut s, hit, toks.len()).is_ok() {
                            m.commit(&mut s, &toks);
                            live.push((s, toks));
                        } else {
                            m.release(s);
                        }
                    }
                    Act::Grow(i, n) if i < live.len() => {
                        let (s, toks) = &mut live[i];
                        let from = toks.len();
                        let before = s.clone();
                        match m.grow(s, from, from + n as usize) {
                            Ok(_) => {
                                toks.extend((0..n as u32).map(|k| 7000 + k));
                                m.commit(s, toks);
                            }
                            Err(_) => prop_assert_eq!(&*s, &before, "a failed grow changes nothing"),
                        }
                    }
                    Act::Fork(i) if i < live.len() => {
                        let f = m.fork(&live[i].0);
                        let t = live[i].1.clone();
                        live.push((f, t));
                    }
                    Act::Release(i) if i < live.len() => {
                        let (s, _) = live.swap_remove(i);
                        m.release(s);
                    }
                    _ => {}
                }
                let held: Vec<&SeqBlocks> = live.iter().map(|(s, _)| s).collect();
                m.check(&held).map_err(TestCaseError::fail)?;
                for (s, t) in &live {
                    prop_assert!(s.capacity(4) >= t.len());
                }
            }
            for (s, _) in live.drain(..) {
                m.release(s);
            }
            m.check(&[]).map_err(TestCaseError::fail)?;
            prop_assert_eq!(m.stats().used_blocks, 0);
        }
    }
}
