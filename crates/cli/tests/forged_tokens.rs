//! Tokens a client made or edited itself never pass the gate (S14), and leave the store
//! exactly as it was.

mod common;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use common::{code, Http, Server};
use serde_json::Value;

/// Rewrites the epoch inside a genuine token, keeping its signature.
fn with_epoch(token: &str, epoch: u64) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3);
    let mut claims: Value = serde_json::from_slice(&B64.decode(parts[1]).unwrap()).unwrap();
    claims["e"] = epoch.into();
    let payload = B64.encode(serde_json::to_vec(&claims).unwrap());
    format!("{}.{}.{}", parts[0], payload, parts[2])
}

#[tokio::test]
async fn forged_tokens_are_rejected_and_change_nothing() {
    let server = Server::start(&[]);
    let http = Http::new(&server.url);
    let genuine = http.acquire("vault", "owner", 60_000).await;
    let token = genuine["token"].as_str().unwrap();
    let (status, _) = http.put("vault", "k", Some(token), "genuine").await;
    assert_eq!(status, 200);

    let keys = http.get("/v1/keys").await.1;
    let key_id = keys["keys"][0]["key_id"].as_str().unwrap().to_owned();
    assert!(token.contains('.'));

    let stranger = palisade_token::Signer::generate();
    let other_lock = http.acquire("other", "owner", 60_000).await;
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "epoch edited upwards",
            with_epoch(token, 1_000_000),
            400,
            "invalid_token",
        ),
        (
            "signed by another key",
            stranger.issue("vault", 1_000_000, "mallory"),
            400,
            "invalid_token",
        ),
        (
            "another key claiming our key id",
            {
                let forged = stranger.issue("vault", 99, "mallory");
                let parts: Vec<&str> = forged.split('.').collect();
                let mut claims: Value =
                    serde_json::from_slice(&B64.decode(parts[1]).unwrap()).unwrap();
                claims["k"] = key_id.clone().into();
                format!(
                    "pal1.{}.{}",
                    B64.encode(serde_json::to_vec(&claims).unwrap()),
                    parts[2]
                )
            },
            400,
            "invalid_token",
        ),
        (
            "genuine token for another lock",
            other_lock["token"].as_str().unwrap().to_owned(),
            403,
            "wrong_lock",
        ),
        (
            "truncated signature",
            token[..token.len() - 4].to_owned(),
            400,
            "invalid_token",
        ),
    ];
    for (what, forged, status, expected) in cases {
        let (got, body) = http.put("vault", "k", Some(&forged), "forged").await;
        assert_eq!((got, code(&body)), (status, expected), "{what}: {body}");
        // Same for delete and the barrier.
        for (route, req) in [
            (
                "delete",
                http.client.delete(format!("{}/v1/kv/vault/k", server.url)),
            ),
            (
                "fence",
                http.client.post(format!("{}/v1/fences/vault", server.url)),
            ),
        ] {
            let (got, body) = http.send(req.header("Fencing-Token", &forged)).await;
            assert_eq!(
                (got, code(&body)),
                (status, expected),
                "{what} ({route}): {body}"
            );
        }
        assert_eq!(
            http.get_value("vault", "k").await.as_deref(),
            Some("genuine"),
            "{what}"
        );
        assert_eq!(http.high_water("vault").await, 1, "{what}");
    }

    // The online check agrees.
    let (status, check) = token_check(&http, &server.url, with_epoch(token, 5)).await;
    assert_eq!(status, 200);
    assert_eq!(check["genuine"], false);
    let (_, check) = token_check(&http, &server.url, &token).await;
    assert_eq!(check["genuine"], true);
    assert_eq!(check["current"], true);
    assert_eq!(check["lease_alive"], true);
    assert_eq!(check["epoch"], 1);
}

/// A lease honoured across a crash is still the lock's current one: the lock's status
/// shows its epoch (not the reservation's ceiling above it), its token checks as current
/// and alive, and `palisade token check` exits 0 for it.
#[tokio::test]
async fn a_lease_honoured_across_a_restart_checks_as_current() {
    let mut server = Server::start(&[]);
    let http = Http::new(&server.url);
    let lease = http.acquire("restarted", "w1", 60_000).await;
    let token = lease["token"].as_str().unwrap().to_owned();
    server.crash_and_restart();
    // A new connection pool: the old one's connections died with the process.
    let http = Http::new(&server.url);
    let (_, status) = http.get("/v1/locks/restarted").await;
    assert_eq!(
        (&status["epoch"], &status["lease_epoch"]),
        (&lease["epoch"], &lease["epoch"]),
        "the holder's epoch after a crash: {status}"
    );
    let (_, check) = token_check(&http, &server.url, &token).await;
    assert_eq!(
        (
            &check["current"],
            &check["lease_alive"],
            &check["current_epoch"]
        ),
        (&true.into(), &true.into(), &lease["epoch"]),
        "{check}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args(["token", "check", "--server", &server.url, &token])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// `POST /v1/tokens/check` of `token`.
async fn token_check(
    http: &Http,
    url: &str,
    token: impl serde::Serialize,
) -> (u16, serde_json::Value) {
    let body = serde_json::json!({ "token": token });
    http.send(
        http.client
            .post(format!("{url}/v1/tokens/check"))
            .json(&body),
    )
    .await
}
