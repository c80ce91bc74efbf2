//! What a holder sees after losing its lease: its late write is refused with a typed
//! error, and the new holder's data stands.
//!
//! Start a server (`palisade serve`), then:
//!
//! ```sh
//! cargo run -p palisade-client --example lost_lease
//! ```
//!
//! Holder A stops renewing (as a process paused by a long GC or a stalled VM would), its
//! lease runs out, B acquires the next epoch and writes. When A "wakes up" and writes with
//! its old token, the store refuses it: `Error::Stale`.

use std::time::Duration;

use palisade_client::{AcquireOptions, Client, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let server =
        std::env::var("PALISADE_SERVER").unwrap_or_else(|_| "http://127.0.0.1:7700".into());
    let client = Client::new(&server)?;
    let lock = format!("example-lost-{}", std::process::id());
    let short = AcquireOptions {
        ttl: Duration::from_millis(500),
        wait: None,
        ..AcquireOptions::default()
    };

    let a = client.acquire(&lock, "A", short).await?;
    let a_kv = a.kv();
    a_kv.put("owner", "A").await?;
    println!("A holds {lock} at epoch {} and wrote", a.epoch());
    // A is paused: dropping the guard stops its renewals without releasing the lock.
    drop(a);

    // B queues until A's lease has run out, then writes under the next epoch.
    let waiting = AcquireOptions {
        ttl: Duration::from_secs(10),
        wait: Some(Duration::from_secs(10)),
        ..AcquireOptions::default()
    };
    let b = client.acquire(&lock, "B", waiting).await?;
    b.fence().await?;
    b.kv().put("owner", "B").await?;
    println!("B holds {lock} at epoch {} and wrote", b.epoch());

    // A wakes up and writes with the token it still has.
    match a_kv.put("owner", "A, late").await {
        Err(Error::Stale { high_water, epoch }) => {
            println!("A's late write refused: its epoch {epoch} is below the mark {high_water}")
        }
        Ok(_) => {
            eprintln!("A's late write was admitted: this must not happen");
            std::process::exit(1);
        }
        Err(other) => return Err(other),
    }
    let owner = client.kv(&lock).get("owner").await?.map(|e| e.value);
    println!(
        "owner = {:?}",
        owner.as_deref().map(String::from_utf8_lossy)
    );
    b.release().await
}
