//! A Rust writer for the cross-language tests of the Python package (`clients/python`):
//! the Rust gates driven from the command line, so a Python test can put a Rust writer and
//! a Python writer on one table and compare the two verifiers on the same inputs.
//!
//! ```text
//! fenced_writer write  --db postgres:<conninfo> | sqlite:<path>  --table <name>
//!                      --public-key <hex> --lock <lock> --key <key> --value <value>
//!                      --token <token> [--seq <n>] [--count <n>]
//! fenced_writer verify --public-key <hex> --lock <lock>     (tokens on stdin, hex, one a line)
//! fenced_writer mint   --secret <hex> --lock <lock> --epoch <n> --holder-hex <hex>
//! ```
//!
//! `write` runs `count` transactions (default 1), each admitting the token and upserting
//! `key = value` (`value:i` when `count > 1`), retrying a transaction that lost a race
//! (`Conflict`) as the docs tell users to. Every outcome is one line on stdout:
//! `admitted <epoch> <high_water>` or `refused <code> <detail>`. `verify` runs each token
//! through `sqlite::admit` on a fresh in-memory database and prints the same lines, with
//! the token error's kind (`malformed`, `unknown_key`, `bad_signature`) as the detail.
//! Exit 0 when every line was printed, 2 on a usage or database error.

use std::collections::HashMap;
use std::io::BufRead;
use std::process::ExitCode;

use palisade_adapters::{postgres, sqlite, AdmitError, Admitted};
use palisade_token::{KeyRing, Signer, TokenError, Verifier};

type Failure = Box<dyn std::error::Error>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fenced_writer: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), Failure> {
    let mut args = std::env::args().skip(1);
    let command = args
        .next()
        .ok_or("missing command: write, verify or mint")?;
    let mut flags = HashMap::new();
    while let Some(flag) = args.next() {
        let name = flag
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument {flag:?}"))?;
        let value = args
            .next()
            .ok_or_else(|| format!("--{name} needs a value"))?;
        flags.insert(name.to_owned(), value);
    }
    let flag = |name: &str| -> Result<&str, Failure> {
        Ok(flags
            .get(name)
            .ok_or_else(|| format!("missing --{name}"))?
            .as_str())
    };
    match command.as_str() {
        "mint" => {
            let signer = Signer::from_secret(hex32(flag("secret")?)?);
            let holder = String::from_utf8(hex(flag("holder-hex")?)?)?;
            println!(
                "{}",
                signer.issue(flag("lock")?, flag("epoch")?.parse()?, &holder)
            );
            Ok(())
        }
        "verify" => {
            let verifier = verifier(flag("public-key")?)?;
            let lock = flag("lock")?;
            for line in std::io::stdin().lock().lines() {
                let token = String::from_utf8(hex(line?.trim())?)?;
                let mut conn = rusqlite::Connection::open_in_memory()?;
                sqlite::migrate(&conn)?;
                let tx = sqlite::begin(&mut conn)?;
                report(sqlite::admit(&tx, &verifier, &token, lock))?;
            }
            Ok(())
        }
        "write" => {
            let verifier = verifier(flag("public-key")?)?;
            let table = flag("table")?;
            if table.is_empty()
                || !table
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return Err("--table must be [A-Za-z0-9_]+".into());
            }
            let seq = flags.get("seq").map(|s| s.parse::<u64>()).transpose()?;
            let count: usize = flags.get("count").map_or(Ok(1), |c| c.parse())?;
            let write = Write {
                verifier: &verifier,
                table,
                lock: flag("lock")?,
                key: flag("key")?,
                value: flag("value")?,
                token: flag("token")?,
                seq,
                count,
            };
            let db = flag("db")?;
            if let Some(path) = db.strip_prefix("sqlite:") {
                write.sqlite(path)
            } else if let Some(config) = db.strip_prefix("postgres:") {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(write.postgres(config))
            } else {
                Err("--db must be sqlite:<path> or postgres:<conninfo>".into())
            }
        }
        other => Err(format!("unknown command {other:?}").into()),
    }
}

struct Write<'a> {
    verifier: &'a Verifier,
    table: &'a str,
    lock: &'a str,
    key: &'a str,
    value: &'a str,
    token: &'a str,
    seq: Option<u64>,
    count: usize,
}

impl Write<'_> {
    fn value(&self, i: usize) -> String {
        if self.count > 1 {
            format!("{}:{i}", self.value)
        } else {
            self.value.to_owned()
        }
    }

    fn sqlite(&self, path: &str) -> Result<(), Failure> {
        let mut conn = rusqlite::Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        let upsert = format!(
            "INSERT INTO {} (key, value) VALUES (?1, ?2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            self.table
        );
        for i in 0..self.count {
            let outcome = loop {
                let tx = sqlite::begin(&mut conn)?;
                let admitted = match self.seq {
                    Some(seq) => {
                        sqlite::admit_sequenced(&tx, self.verifier, self.token, self.lock, seq)
                    }
                    None => sqlite::admit(&tx, self.verifier, self.token, self.lock),
                };
                match admitted {
                    Err(AdmitError::Conflict) => continue, // dropped: rolled back
                    Err(e) => break Err(e),
                    Ok(admitted) => {
                        tx.execute(&upsert, [self.key, &self.value(i)])?;
                        tx.commit()?;
                        break Ok(admitted);
                    }
                }
            };
            report(outcome)?;
        }
        Ok(())
    }

    async fn postgres(&self, config: &str) -> Result<(), Failure> {
        let (mut client, connection) =
            tokio_postgres::connect(config, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        let upsert = format!(
            "INSERT INTO {} (key, value) VALUES ($1, $2) \
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            self.table
        );
        for i in 0..self.count {
            let outcome = loop {
                let tx = client.transaction().await?;
                let admitted = match self.seq {
                    Some(seq) => {
                        postgres::admit_sequenced(&tx, self.verifier, self.token, self.lock, seq)
                            .await
                    }
                    None => postgres::admit(&tx, self.verifier, self.token, self.lock).await,
                };
                match admitted {
                    Err(AdmitError::Conflict) => continue, // dropped: rolled back
                    Err(e) => break Err(e),
                    Ok(admitted) => {
                        tx.execute(&upsert, &[&self.key, &self.value(i)]).await?;
                        tx.commit().await?;
                        break Ok(admitted);
                    }
                }
            };
            report(outcome)?;
        }
        Ok(())
    }
}

/// Prints one outcome line; a backend failure is an error of the run, not an outcome.
fn report(outcome: Result<Admitted, AdmitError>) -> Result<(), Failure> {
    match outcome {
        Ok(admitted) => println!(
            "admitted {} {}",
            admitted.epoch(),
            admitted.high_water.epoch
        ),
        Err(AdmitError::Backend(e)) => return Err(e),
        Err(e) => {
            let detail = match &e {
                AdmitError::InvalidToken(TokenError::Malformed(_)) => "malformed".to_owned(),
                AdmitError::InvalidToken(TokenError::UnknownKey(_)) => "unknown_key".to_owned(),
                AdmitError::InvalidToken(TokenError::BadSignature) => "bad_signature".to_owned(),
                AdmitError::Stale { high_water, epoch } => format!("{high_water}:{epoch}"),
                AdmitError::StaleSequence {
                    high_water,
                    high_water_seq,
                    epoch,
                    seq,
                } => format!("{high_water}:{high_water_seq}:{epoch}:{seq}"),
                AdmitError::WrongLock { token_lock, .. } => token_lock.clone(),
                _ => "-".to_owned(),
            };
            println!("refused {} {detail}", e.code());
        }
    }
    Ok(())
}

fn verifier(public_keys: &str) -> Result<Verifier, Failure> {
    let mut ring = KeyRing::new();
    for key in public_keys.split(',') {
        ring.insert_bytes(&hex32(key)?)?;
    }
    Ok(Verifier::new(ring, 1024))
}

fn hex(text: &str) -> Result<Vec<u8>, Failure> {
    text.as_bytes()
        .chunks(2)
        .map(|pair| match pair {
            [hi, lo] => Ok(u8::from_str_radix(std::str::from_utf8(&[*hi, *lo])?, 16)?),
            _ => Err("odd number of hex digits".into()),
        })
        .collect()
}

fn hex32(text: &str) -> Result<[u8; 32], Failure> {
    hex(text)?
        .try_into()
        .map_err(|_| "expected 32 bytes (64 hex digits)".into())
}
