//! A real etcd cluster for end-to-end tests (see `palisade_test_support::etcd`).

pub use palisade_test_support::etcd::EtcdCluster;
