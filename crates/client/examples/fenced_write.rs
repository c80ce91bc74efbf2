//! Write to the fenced store the way a holder should: acquire, fence, write with the
//! token, make retries safe, release.
//!
//! Start a server (`palisade serve`), then:
//!
//! ```sh
//! cargo run -p palisade-client --example fenced_write
//! ```

use palisade_client::{AcquireOptions, Client, Error, WriteOptions};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let server =
        std::env::var("PALISADE_SERVER").unwrap_or_else(|_| "http://127.0.0.1:7700".into());
    let client = Client::new(&server)?;
    let lock = format!("example-orders-{}", std::process::id());
    let guard = client
        .acquire(&lock, "example", AcquireOptions::default())
        .await?;

    // Acquiring notifies no resource: the barrier makes the namespace refuse every older
    // holder before we write anything (S10).
    let high_water = guard.fence().await?;
    println!(
        "{lock}: epoch {} fenced in (high-water {high_water})",
        guard.epoch()
    );

    let kv = guard.kv();
    let first = kv.put("invoice-17", "issued").await?;
    println!("invoice-17 = issued (revision {})", first.revision);

    // A retry of a write whose answer was lost must not apply twice: fencing orders
    // holders, not the operations of one holder (S9). An idempotency key makes the retry
    // return the first outcome; If-Match makes the update conditional.
    let paid = WriteOptions {
        if_match: Some(first.revision),
        idempotency_key: Some(format!("pay-invoice-17-{}", std::process::id())),
        ..WriteOptions::default()
    };
    let once = kv.put_with("invoice-17", "paid", &paid).await?;
    let again = kv.put_with("invoice-17", "paid", &paid).await?;
    assert_eq!(once.revision, again.revision);
    println!(
        "invoice-17 = paid (revision {}; the retry was replayed: {})",
        again.revision, again.replayed
    );

    if let Some(entry) = client.kv(&lock).get("invoice-17").await? {
        println!(
            "read back {:?}, written by epoch {}",
            String::from_utf8_lossy(&entry.value),
            entry.epoch
        );
    }
    guard.release().await
}
