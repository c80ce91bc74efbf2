//! Hold a lock while working, and stop as soon as the lease is lost.
//!
//! Start a server (`palisade serve`), then:
//!
//! ```sh
//! cargo run -p palisade-client --example lease_guard
//! ```
//!
//! The guard renews the lease in the background every third of its TTL. `guard.lost()`
//! resolves when the server says the lease expired or no renewal succeeded in time; the
//! work below races it, as real work should.

use std::time::Duration;

use palisade_client::{AcquireOptions, Client, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let server =
        std::env::var("PALISADE_SERVER").unwrap_or_else(|_| "http://127.0.0.1:7700".into());
    let client = Client::new(&server)?;
    let lock = format!("example-guard-{}", std::process::id());
    let options = AcquireOptions {
        ttl: Duration::from_secs(3),
        // Queue for up to 10 s if someone else holds it.
        wait: Some(Duration::from_secs(10)),
        ..AcquireOptions::default()
    };
    let guard = client.acquire(&lock, "example", options).await?;
    println!("holding {lock} at epoch {}", guard.epoch());

    // Work that outlives one TTL: the lease stays ours because the guard renews it.
    let work = async {
        for step in 1..=5 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            println!("step {step} done");
        }
    };
    tokio::select! {
        () = work => println!("work finished while the lease was held"),
        () = guard.lost() => {
            // Whatever this process still sends carries a stale token from now on.
            eprintln!("lease lost: stopping");
            return Ok(());
        }
    }
    guard.release().await?;
    println!("released {lock}");
    Ok(())
}
