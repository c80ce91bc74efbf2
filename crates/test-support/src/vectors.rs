//! The committed vectors files (`vectors/*.json`), each checked against the Rust code that
//! generates it: the other languages' tests read the file, so a file that lags the code
//! would let them pass against an old truth.

use std::path::Path;

/// Asserts that `file` holds `made` (pretty-printed, with a final newline). With
/// `PALISADE_UPDATE_VECTORS` set, writes it first; `regenerate` is the command that does,
/// named in the failure.
pub fn assert_committed(file: &str, made: &serde_json::Value, regenerate: &str) {
    let made = serde_json::to_string_pretty(made).expect("vectors serialize") + "\n";
    if std::env::var_os("PALISADE_UPDATE_VECTORS").is_some() {
        if let Some(dir) = Path::new(file).parent() {
            std::fs::create_dir_all(dir).expect("create the vectors directory");
        }
        std::fs::write(file, &made).expect("write the vectors file");
    }
    let committed = std::fs::read_to_string(file).unwrap_or_default();
    assert!(
        committed == made,
        "{file} is not what the code makes: run PALISADE_UPDATE_VECTORS=1 {regenerate}, and \
         commit the file"
    );
}
