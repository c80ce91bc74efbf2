//! Drivers for the systems Palisade is compared with. Each is behind a cargo feature
//! (`peers`: Redis and PostgreSQL; `peer-etcd`: etcd), so a default build of the
//! `palisade` binary does not link their clients.
//!
//! Each recipe is the natural one for its system, made as durable as Palisade by the
//! server's configuration (see `bench/compare`), with one round trip per step where the
//! system allows it: a Lua script, one SQL statement, one etcd transaction.

use std::sync::Arc;

#[cfg(any(feature = "peers", feature = "peer-etcd"))]
pub(crate) use self::recipes::{Peer, Recipes};
use crate::{BenchError, Plan, Worker};

#[cfg(feature = "peer-etcd")]
mod etcd;
#[cfg(feature = "peers")]
mod postgres;
#[cfg(feature = "peers")]
mod redis;

/// Zero-padded decimal, so that byte order is numeric order (etcd compares values as
/// bytes).
#[cfg_attr(not(feature = "peer-etcd"), allow(dead_code))]
pub(crate) fn padded(epoch: u64) -> String {
    format!("{epoch:020}")
}

/// The keys of one lock in a key-value peer (etcd, Redis), named after the lock with `sep`
/// between: the lock, its epoch counter, its high-water mark and its values.
#[cfg(any(feature = "peers", feature = "peer-etcd"))]
struct LockKeys<E> {
    lock_key: String,
    epoch_key: String,
    hw_key: String,
    value_keys: Vec<String>,
    /// The epoch this client holds (`j2`).
    epoch: E,
}

#[cfg(any(feature = "peers", feature = "peer-etcd"))]
impl<E: Default> LockKeys<E> {
    /// The keys of each lock client `client` works on.
    fn of_worker(plan: &Plan, client: usize, sep: char) -> Vec<LockKeys<E>> {
        plan.worker_locks(client)
            .iter()
            .map(|name| LockKeys {
                lock_key: format!("{name}{sep}lock"),
                epoch_key: format!("{name}{sep}epoch"),
                hw_key: format!("{name}{sep}hw"),
                value_keys: (0..crate::driver::KEYS_PER_LOCK)
                    .map(|k| format!("{name}{sep}k{k}"))
                    .collect(),
                epoch: E::default(),
            })
            .collect()
    }
}

#[allow(unused_variables)]
pub async fn redis_worker(plan: Arc<Plan>, client: usize) -> Result<Box<dyn Worker>, BenchError> {
    #[cfg(feature = "peers")]
    return redis::worker(plan, client).await;
    #[cfg(not(feature = "peers"))]
    Err(BenchError::NotBuilt {
        target: crate::Target::Redis,
        feature: "peers",
    })
}

#[allow(unused_variables)]
pub async fn postgres_prepare(plan: &Plan) -> Result<(), BenchError> {
    #[cfg(feature = "peers")]
    return postgres::prepare(plan).await;
    #[cfg(not(feature = "peers"))]
    Err(BenchError::NotBuilt {
        target: crate::Target::Postgres,
        feature: "peers",
    })
}

#[allow(unused_variables)]
pub async fn postgres_worker(
    plan: Arc<Plan>,
    client: usize,
) -> Result<Box<dyn Worker>, BenchError> {
    #[cfg(feature = "peers")]
    return postgres::worker(plan, client).await;
    #[cfg(not(feature = "peers"))]
    Err(BenchError::NotBuilt {
        target: crate::Target::Postgres,
        feature: "peers",
    })
}

#[allow(unused_variables)]
pub async fn etcd_worker(plan: Arc<Plan>, client: usize) -> Result<Box<dyn Worker>, BenchError> {
    #[cfg(feature = "peer-etcd")]
    return etcd::worker(plan, client).await;
    #[cfg(not(feature = "peer-etcd"))]
    Err(BenchError::NotBuilt {
        target: crate::Target::Etcd,
        feature: "peer-etcd",
    })
}

#[cfg(any(feature = "peers", feature = "peer-etcd"))]
mod recipes {
    use async_trait::async_trait;

    use crate::driver::{refused, KEYS_PER_LOCK};
    use crate::{BenchError, Job, OpError, Outcome, Plan, Worker};
    use palisade_api::ErrorCode;

    /// The steps of one system's recipes, on the worker's lock `i` (and its value `key`).
    /// [`Peer`] runs every job with them, the same way for every system.
    #[async_trait]
    pub(crate) trait Recipes: Send {
        /// Takes the lock if it is free, keeping the epoch it got for the fenced writes;
        /// whether it was taken. `seq` makes the holder value unique.
        async fn acquire(&mut self, i: usize, seq: usize) -> Result<bool, OpError>;
        async fn release(&mut self, i: usize, seq: usize) -> Result<(), OpError>;
        /// The fenced write with the epoch the lock was acquired with; whether admitted.
        async fn fenced_write(&mut self, i: usize, key: usize) -> Result<bool, OpError>;
        async fn write_plain(&mut self, i: usize, key: usize) -> Result<(), OpError>;
        /// Reads the lock's first value; whether it came back whole.
        async fn read(&mut self, i: usize) -> Result<bool, OpError>;
        async fn finish(&mut self) {}
        /// How many locks the recipes hold.
        fn locks(&self) -> usize;
    }

    /// A [`Worker`] over a system's [`Recipes`] and its client's locks.
    pub(crate) struct Peer<R> {
        recipes: R,
        job: Job,
        locks: usize,
        n: usize,
    }

    impl<R: Recipes + 'static> Peer<R> {
        /// Readies `recipes` for the plan's job on its locks and makes them client
        /// `client`'s worker: for `j2` each lock is acquired once for the whole run (as a Palisade client
        /// does), for `read` each lock's first value is written.
        pub(crate) async fn prepared(
            mut recipes: R,
            plan: &Plan,
            client: usize,
        ) -> Result<Box<dyn Worker>, BenchError> {
            let locks = recipes.locks();
            let setup = async {
                for i in 0..locks {
                    match plan.job {
                        Job::J2 if !recipes.acquire(i, 0).await? => {
                            return Err(OpError::new(ErrorCode::LockHeld.as_str()))
                        }
                        Job::Read => recipes.write_plain(i, 0).await?,
                        _ => {}
                    }
                }
                Ok(())
            };
            setup.await.map_err(|e| plan.setup_error(e.code))?;
            Ok(Box::new(Peer {
                recipes,
                job: plan.job,
                locks: locks.max(1),
                // The client's index, so that holder values differ between clients.
                n: client,
            }))
        }
    }

    #[async_trait]
    impl<R: Recipes> Worker for Peer<R> {
        async fn op(&mut self) -> Result<Outcome, OpError> {
            self.n = self.n.wrapping_add(1);
            let (n, i) = (self.n, self.n % self.locks);
            let key = (n / self.locks) % KEYS_PER_LOCK;
            let r = &mut self.recipes;
            match self.job {
                Job::J1 | Job::Contended => {
                    if r.acquire(i, n).await? {
                        r.release(i, n).await?;
                        Ok(Outcome::Done)
                    } else if self.job == Job::Contended {
                        Ok(refused(true).await)
                    } else {
                        Err(OpError::new(ErrorCode::LockHeld.as_str()))
                    }
                }
                Job::J2 => match r.fenced_write(i, key).await? {
                    true => Ok(Outcome::Done),
                    false => Err(OpError::new(ErrorCode::StaleToken.as_str())),
                },
                Job::Plain => {
                    r.write_plain(i, key).await?;
                    Ok(Outcome::Done)
                }
                Job::Read => match r.read(i).await? {
                    true => Ok(Outcome::Done),
                    false => Err(OpError::new("wrong_value")),
                },
                Job::Scale => Err(OpError::new("unsupported_job")),
            }
        }

        async fn finish(&mut self) {
            self.recipes.finish().await;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn padded_sorts_numerically() {
        assert!(super::padded(9) < super::padded(10));
        assert_eq!(super::padded(7).len(), 20);
    }
}
