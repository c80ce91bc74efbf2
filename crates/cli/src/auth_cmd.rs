//! `palisade auth`: bearer keys for an auth file.

use anyhow::Context;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum AuthCommand {
    /// Print a fresh random key (256 bits) and the `key_sha256` line for the auth file.
    /// Give the key to the client (PALISADE_KEY or --key-file); only the digest goes into
    /// the server's auth file.
    NewKey,
    /// Read a key from standard input and print its `key_sha256` line.
    HashKey,
}

pub fn run(command: AuthCommand) -> anyhow::Result<()> {
    use palisade_server::auth::{key_digest, new_key};
    match command {
        AuthCommand::NewKey => {
            let key = new_key();
            println!("key: {key}");
            println!("key_sha256 = \"{}\"", hex::encode(key_digest(&key)));
        }
        AuthCommand::HashKey => {
            let mut key = String::new();
            std::io::stdin()
                .read_line(&mut key)
                .context("cannot read the key from standard input")?;
            let key = key.trim();
            anyhow::ensure!(!key.is_empty(), "no key on standard input");
            println!("key_sha256 = \"{}\"", hex::encode(key_digest(key)));
        }
    }
    Ok(())
}
