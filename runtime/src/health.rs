//! Whether the engine can serve, as `/health` and `/ready` report it.
//!
//! Three ways an engine stops serving, each seen here at once:
//! - its thread ended (returned or panicked: [`AliveGuard`] clears `alive` when dropped,
//!   unwinding included);
//! - it cannot go on (`fatal`: the backend failed [`FATAL_AFTER`] steps in a row, e.g. a GPU
//!   context lost to an illegal address);
//! - a step runs far past its measured bounds (the watchdog: a step in flight longer than
//!   `max(floor, factor x the slowest step seen)` — a hung kernel or a deadlocked collective).
//!   The liveness probe then fails and the orchestrator restarts the pod; the stall is counted in
//!   `dsc_engine_stalls_total`. A step that finishes after all makes the engine healthy again.

use crate::metrics::Metrics;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Consecutive failed steps after which the engine is reported as unable to go on.
pub const FATAL_AFTER: usize = 3;

/// The watchdog's bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Watchdog {
    /// a step is never called stalled before this
    pub floor: Duration,
    /// ... nor before this many times the slowest step seen so far
    pub factor: f64,
}

impl Default for Watchdog {
    fn default() -> Self {
        Watchdog { floor: Duration::from_secs(30), factor: 10.0 }
    }
}

pub struct Health {
    alive: AtomicBool,
    fatal: Mutex<Option<String>>,
    epoch: Instant,
    /// nanoseconds since `epoch` + 1 at which the step in flight started; 0: none
    step_since: AtomicU64,
    /// the slowest finished step, nanoseconds
    slowest: AtomicU64,
    stalled: AtomicBool,
    watchdog: Watchdog,
    metrics: Arc<Metrics>,
}

impl Health {
    pub fn new(watchdog: Watchdog, metrics: Arc<Metrics>) -> Arc<Health> {
        metrics.engine_healthy.set(1);
        Arc::new(Health {
            alive: AtomicBool::new(true),
            fatal: Mutex::new(None),
            epoch: Instant::now(),
            step_since: AtomicU64::new(0),
            slowest: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            watchdog,
            metrics,
        })
    }

    fn bound(&self) -> Duration {
        let slowest = Duration::from_nanos(self.slowest.load(Ordering::Relaxed));
        self.watchdog.floor.max(slowest.mul_f64(self.watchdog.factor))
    }

    /// Now, as `step_since` holds it (never 0).
    fn tick(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    pub fn step_started(&self) {
        self.step_since.store(self.tick(), Ordering::SeqCst);
    }

    pub fn step_ended(&self) {
        let since = self.step_since.swap(0, Ordering::SeqCst);
        if since == 0 {
            return;
        }
        let took = Duration::from_nanos(self.tick().saturating_sub(since));
        if took > self.bound() {
            self.stall();
        }
        self.slowest.fetch_max(took.as_nanos() as u64, Ordering::Relaxed);
        if self.stalled.swap(false, Ordering::SeqCst) {
            tracing::warn!(target: "dsc::engine", "the stalled step finished after {:.1} s", took.as_secs_f64());
        }
        self.publish();
    }

    fn stall(&self) {
        if !self.stalled.swap(true, Ordering::SeqCst) {
            self.metrics.engine_stalls.inc();
            tracing::error!(target: "dsc::engine", "an engine step has run past the watchdog bound ({:.1} s)", self.bound().as_secs_f64());
        }
    }

    /// The engine cannot go on: reported until the process restarts.
    pub fn set_fatal(&self, why: String) {
        tracing::error!(target: "dsc::engine", "engine unhealthy: {why}");
        *self.fatal.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.publish();
    }

    pub fn set_dead(&self) {
        self.alive.store(false, Ordering::SeqCst);
        self.publish();
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Ok while the engine serves; else why not.
    pub fn status(&self) -> Result<(), String> {
        let r = self.check();
        self.metrics.engine_healthy.set(r.is_ok() as i64);
        r
    }

    fn check(&self) -> Result<(), String> {
        if !self.alive() {
            return Err("the engine thread has stopped".into());
        }
        if let Some(why) = self.fatal.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(why);
        }
        let since = self.step_since.load(Ordering::SeqCst);
        if since != 0 {
            let running = Duration::from_nanos(self.tick().saturating_sub(since));
            if running > self.bound() {
                self.stall();
                return Err(format!("an engine step has run for {:.1} s, past the watchdog bound of {:.1} s", running.as_secs_f64(), self.bound().as_secs_f64()));
            }
        }
        Ok(())
    }

    fn publish(&self) {
        let _ = self.status();
    }
}

/// Clears [`Health::alive`] when the engine thread ends, by return or by unwinding.
pub struct AliveGuard(pub Arc<Health>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.set_dead();
    }
}
