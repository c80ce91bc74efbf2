//! The issuer's keys on disk: the data directory's key set ([`file`]) and the offline key
//! commands run against a stopped server's directory ([`offline`]). The running server's
//! key registry is the server's (`palisade_server::keys`).

pub mod file;
pub mod offline;

use palisade_api::wire::AdminKey;
pub use palisade_token::KeySet;

/// Every key of `set`, oldest first, as `GET /v1/admin/keys` and `palisade admin keys`
/// show them.
pub fn views(set: &KeySet) -> Vec<AdminKey> {
    set.keys()
        .iter()
        .map(|k| AdminKey {
            key_id: k.key_id.clone(),
            alg: "Ed25519".into(),
            public_key: k.public_key_b64(),
            status: k.state.as_str().into(),
            source: "key_set".into(),
            created_at: Some(k.created_at),
            replaced_at: k.replaced_at,
            retired_at: k.retired_at,
        })
        .collect()
}
