//! Principals for tests with authentication on: an auth file with fresh keys, and a
//! client that sends one principal's key.

use std::path::{Path, PathBuf};

use reqwest::{Method, RequestBuilder};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::Server;

/// One principal of a test auth file: its name, its key and the file's lines for it.
pub struct Who {
    pub name: &'static str,
    pub key: String,
}

pub fn digest(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Writes an auth file with these principals (name, extra TOML lines) into `dir`.
pub fn auth_file(dir: &Path, principals: &[(&'static str, &str)]) -> (PathBuf, Vec<Who>) {
    let mut text = String::new();
    let mut people = Vec::new();
    for (name, body) in principals {
        let key = format!("test-key-of-{name}-{}", rand_suffix());
        text.push_str(&format!(
            "[[principal]]\nname = \"{name}\"\nkey_sha256 = \"{}\"\n{body}\n\n",
            digest(&key)
        ));
        people.push(Who { name, key });
    }
    let path = dir.join("auth.toml");
    std::fs::write(&path, text).unwrap();
    (path, people)
}

fn rand_suffix() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{nanos:08x}")
}

pub fn grant(locks: &str, verbs: &[&str]) -> String {
    let allow: Vec<String> = verbs.iter().map(|v| format!("\"{v}\"")).collect();
    format!(
        "[[principal.grant]]\nlocks = \"{locks}\"\nallow = [{}]\n",
        allow.join(", ")
    )
}

/// A client that sends one principal's key (or a given Authorization value, or none).
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(server: &Server) -> Api {
        Api {
            base: server.url.clone(),
            http: reqwest::Client::new(),
        }
    }

    pub fn req(&self, auth: Option<&str>, method: Method, path: &str) -> RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match auth {
            Some(key) => req.bearer_auth(key),
            None => req,
        }
    }

    pub async fn send(&self, req: RequestBuilder) -> (u16, Value, reqwest::header::HeaderMap) {
        let resp = req.send().await.expect("request sent");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::Null),
            headers,
        )
    }

    /// The body of the answer to `req`, as text.
    pub async fn text(&self, req: RequestBuilder) -> String {
        let resp = req.send().await.expect("request sent");
        resp.text().await.expect("a body")
    }

    /// Acquires as `key` (optional holder label); panics unless granted.
    pub async fn acquire(&self, key: &str, lock: &str, label: Option<&str>) -> Value {
        let mut body = json!({"ttl_ms": 60_000});
        if let Some(label) = label {
            body["holder"] = json!(label);
        }
        let (status, body, _) = self
            .send(
                self.req(
                    Some(key),
                    Method::POST,
                    &format!("/v1/locks/{lock}/acquire"),
                )
                .json(&body),
            )
            .await;
        assert_eq!(status, 200, "acquire {lock}: {body}");
        body
    }

    pub async fn put(
        &self,
        key: &str,
        lock: &str,
        k: &str,
        token: &str,
        value: &str,
    ) -> (u16, Value) {
        let (status, body, _) = self
            .send(
                self.req(Some(key), Method::PUT, &format!("/v1/kv/{lock}/{k}"))
                    .header("Fencing-Token", token)
                    .body(value.to_owned()),
            )
            .await;
        (status, body)
    }

    /// Everything observable about a lock and its namespace, read as an admin.
    pub async fn state(&self, admin: &str, lock: &str) -> Value {
        let (_, status, _) = self
            .send(self.req(Some(admin), Method::GET, &format!("/v1/locks/{lock}")))
            .await;
        let (_, fence, _) = self
            .send(self.req(Some(admin), Method::GET, &format!("/v1/fences/{lock}")))
            .await;
        let (_, keys, _) = self
            .send(self.req(Some(admin), Method::GET, &format!("/v1/kv/{lock}")))
            .await;
        let value = self
            .text(self.req(Some(admin), Method::GET, &format!("/v1/kv/{lock}/k")))
            .await;
        // remaining_ms moves on its own; everything else must not.
        let mut status = status;
        status["remaining_ms"] = Value::Null;
        json!({"status": status, "fence": fence, "keys": keys, "value": value})
    }
}

/// The key of `name` among `people`.
pub fn key_of(people: &[Who], name: &str) -> String {
    people
        .iter()
        .find(|w| w.name == name)
        .map(|w| w.key.clone())
        .unwrap_or_else(|| panic!("no principal {name}"))
}
