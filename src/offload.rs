//! CPU-heavy work off the async workers. A request whose body is megabytes long takes
//! milliseconds to tens of milliseconds to parse, hash, count and compact; done on an
//! async worker, that time is taken from every other connection the worker serves
//! (health checks included). [`Offload::run`] runs such work with
//! `tokio::task::block_in_place` — the worker hands its other tasks to a fresh one and
//! the work runs where it is, borrowing what it needs — under a semaphore that bounds
//! how many run at once (`compaction.cpu_concurrency`), so an attacker's burst of huge
//! compactions queues instead of taking every core.
//!
//! On a current-thread runtime (unit tests) there is nowhere else to go: the work runs
//! inline.

use std::sync::Arc;

use tokio::runtime::{Handle, RuntimeFlavor};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::strategies::Cpu;

/// Bodies smaller than this are worked on where they are: moving work to another
/// thread costs more than it saves below it.
pub const SMALL: usize = 256 * 1024;

/// The bounded CPU pool. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Offload {
    permits: Arc<Semaphore>,
}

impl Offload {
    /// At most `concurrency` pieces of work at once (0: half the cores, at least one).
    pub fn new(concurrency: usize) -> Self {
        let concurrency = match concurrency {
            0 => std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
            n => n,
        };
        Self {
            permits: Arc::new(Semaphore::new(concurrency)),
        }
    }

    /// A permit for work on a request of `size` bytes: `None` (no wait, no bound) when
    /// the request is small enough to be worked on where it is (under [`SMALL`]).
    pub async fn permit_for(&self, size: usize) -> Option<OwnedSemaphorePermit> {
        if size < SMALL {
            return None;
        }
        Some(self.acquire().await)
    }

    /// Runs `work` with a permit from [`Offload::permit_for`]: off the async workers
    /// when it holds one, inline when it does not.
    pub fn run_with<R>(
        &self,
        permit: &Option<OwnedSemaphorePermit>,
        work: impl FnOnce() -> R,
    ) -> R {
        match permit {
            Some(p) => self.run(p, work),
            None => work(),
        }
    }
}

impl Cpu for Offload {
    type Permit = OwnedSemaphorePermit;

    async fn acquire(&self) -> OwnedSemaphorePermit {
        loop {
            // The semaphore is never closed; if it were, another one stands in.
            match self.permits.clone().acquire_owned().await {
                Ok(permit) => return permit,
                Err(_) => tokio::task::yield_now().await,
            }
        }
    }

    fn run<R>(&self, _: &OwnedSemaphorePermit, work: impl FnOnce() -> R) -> R {
        let multi_thread =
            Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
        if multi_thread {
            tokio::task::block_in_place(work)
        } else {
            work()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn heavy_work_leaves_the_workers_free_and_is_bounded() {
        let offload = Offload::new(1);
        let busy = |ms: u64| {
            let until = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
        };
        // Two pieces of 300 ms on a pool of one: one after the other.
        let started = Instant::now();
        let a = {
            let o = offload.clone();
            tokio::spawn(async move {
                let p = o.acquire().await;
                o.run(&p, || busy(300))
            })
        };
        let b = {
            let o = offload.clone();
            tokio::spawn(async move {
                let p = o.acquire().await;
                o.run(&p, || busy(300))
            })
        };
        // Meanwhile a timer on the async workers keeps its pace.
        let mut late = Duration::ZERO;
        for _ in 0..10 {
            let t = Instant::now();
            tokio::time::sleep(Duration::from_millis(20)).await;
            late = late.max(t.elapsed().saturating_sub(Duration::from_millis(20)));
        }
        a.await.unwrap();
        b.await.unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(600),
            "bounded to one at a time"
        );
        assert!(
            late < Duration::from_millis(150),
            "the workers stayed free: {late:?} late"
        );
    }
}
