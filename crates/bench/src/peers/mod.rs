//! Drivers for the systems Palisade is compared with. Each is behind a cargo feature
//! (`peers`: Redis and PostgreSQL; `peer-etcd`: etcd), so a default build of the
//! `palisade` binary does not link their clients.
//!
//! Each recipe is the natural one for its system, made as durable as Palisade by the
//! server's configuration (see `bench/compare`), with one round trip per step where the
//! system allows it: a Lua script, one SQL statement, one etcd transaction.

use std::sync::Arc;

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

#[cfg(test)]
mod tests {
    #[test]
    fn padded_sorts_numerically() {
        assert!(super::padded(9) < super::padded(10));
        assert_eq!(super::padded(7).len(), 20);
    }
}
