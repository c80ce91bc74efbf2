//! The dashboard against the real binary: `/ui` and its two files are served with their
//! content types and a self-only Content-Security-Policy, without credentials even with
//! authentication on, and load nothing from another origin; the namespaces listing it
//! reads (`GET /v1/fences`) pages with marks and key counts and follows the auth file.
//! The page itself is driven in a real browser by `scripts/ui-test`.

mod common;

use reqwest::Method;
use serde_json::Value;

use common::principals::{auth_file, grant, Api};
use common::{code, Server};

const ASSETS: [(&str, &str); 3] = [
    ("/ui", "text/html; charset=utf-8"),
    ("/ui/app.js", "text/javascript; charset=utf-8"),
    ("/ui/app.css", "text/css; charset=utf-8"),
];

/// Fetches every asset without credentials and checks what each answer must carry;
/// returns their bodies.
async fn assets(base: &str) -> Vec<String> {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut bodies = Vec::new();
    for (path, content_type) in ASSETS {
        let resp = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let headers = resp.headers();
        assert_eq!(headers["content-type"], content_type, "{path}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let body = resp.text().await.unwrap();
        assert!(
            !body.contains("http://") && !body.contains("https://"),
            "{path} names another origin"
        );
        bodies.push(body);
    }
    let slash = http.get(format!("{base}/ui/")).send().await.unwrap();
    assert_eq!(slash.status(), 308);
    assert_eq!(slash.headers()["location"], "/ui");
    let posted = http.post(format!("{base}/ui")).send().await.unwrap();
    assert_eq!(posted.status(), 405);
    let body: Value = posted.json().await.unwrap();
    assert_eq!(code(&body), "method_not_allowed");
    bodies
}

/// `GET /` leads a browser to the dashboard, with or without authentication.
async fn root_leads_to_the_dashboard(base: &str) {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let answer = client.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(answer.status(), 307);
    assert_eq!(answer.headers()["location"], "/ui");
}

#[tokio::test]
async fn the_dashboard_is_served_with_its_types_and_policy() {
    let server = Server::start(&[]);
    root_leads_to_the_dashboard(&server.url).await;
    let bodies = assets(&server.url).await;
    let missing = reqwest::get(format!("{}/ui/nope.js", server.url))
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert!(bodies[0].contains("<script src=\"/ui/app.js\" defer></script>"));
    assert!(bodies[0].contains("href=\"/ui/app.css\""));
    // The script reads the events stream with fetch() and keeps the key per tab.
    assert!(bodies[1].contains("sessionStorage.setItem"));
    assert!(!bodies[1].contains("localStorage.") && !bodies[1].contains("document.cookie"));
    assert!(bodies[1].contains("Last-Event-ID"));
}

#[tokio::test]
async fn with_auth_on_the_files_are_public_and_the_data_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let (path, who) = auth_file(
        dir.path(),
        &[
            ("ops", "admin = true"),
            ("app", &grant("app-*", &["acquire", "read", "write"])),
        ],
    );
    let server = Server::start(&["--auth-file", path.to_str().unwrap()]);
    root_leads_to_the_dashboard(&server.url).await;
    assets(&server.url).await;
    let api = Api::new(&server);
    for data in ["/v1/locks", "/v1/fences", "/v1/events", "/metrics"] {
        let (status, body, _) = api.send(api.req(None, Method::GET, data)).await;
        assert_eq!(status, 401, "{data}: {body}");
        assert_eq!(code(&body), "unauthenticated");
    }
    let (ops, app) = (&who[0].key, &who[1].key);
    for lock in ["app-1", "other"] {
        let granted = api.acquire(ops, lock, None).await;
        let token = granted["token"].as_str().unwrap();
        let (status, body) = api.put(ops, lock, "k", token, "v").await;
        assert_eq!(status, 200, "{body}");
    }
    let names = |body: &Value| -> Vec<String> {
        body["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["lock"].as_str().unwrap().to_owned())
            .collect()
    };
    let (status, body, _) = api
        .send(api.req(Some(ops), Method::GET, "/v1/fences"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(names(&body), ["app-1", "other"]);
    let (status, body, _) = api
        .send(api.req(Some(app), Method::GET, "/v1/fences"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(names(&body), ["app-1"]);
}

#[tokio::test]
async fn namespaces_are_listed_a_page_at_a_time_with_marks_and_key_counts() {
    let server = Server::start(&[]);
    let http = common::Http::new(&server.url);
    // Four namespaces, one key each under epoch 1; then "ns-b" gets a second key under
    // epoch 2. A lock nobody wrote under has no namespace.
    for lock in ["ns-a", "ns-b", "ns-c", "other"] {
        let granted = http.acquire(lock, "w", 60_000).await;
        let token = granted["token"].as_str().unwrap();
        let (status, body) = http.put(lock, "k1", Some(token), "one").await;
        assert_eq!(status, 200, "{body}");
        if lock == "ns-b" {
            http.release(&granted).await;
            let again = http.acquire(lock, "w", 60_000).await;
            assert_eq!(again["epoch"], 2);
            let token = again["token"].as_str().unwrap();
            let (status, body) = http.put(lock, "k2", Some(token), "two").await;
            assert_eq!(status, 200, "{body}");
        }
    }
    http.acquire("never-written", "w", 60_000).await;
    let list = |query: &'static str| {
        let http = &http;
        async move {
            let (status, body) = http.get(&format!("/v1/fences?{query}")).await;
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    let page = list("prefix=ns-&limit=2").await;
    assert_eq!(page["next"], "ns-b");
    let rows = page["namespaces"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["lock"], "ns-a");
    assert_eq!(rows[0]["high_water"], 1);
    assert_eq!(rows[0]["keys"], 1);
    assert_eq!(rows[0]["bytes"], 5);
    assert_eq!(rows[0]["policy"], "epoch");
    assert_eq!(rows[1]["lock"], "ns-b");
    assert_eq!(rows[1]["high_water"], 2);
    assert_eq!(rows[1]["keys"], 2);
    assert_eq!(rows[1]["bytes"], 10);
    let page = list("prefix=ns-&limit=2&after=ns-b").await;
    assert_eq!(page["next"], Value::Null);
    let rows = page["namespaces"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["lock"], "ns-c");
    // Everything: the lock nobody wrote under has no namespace.
    let all = list("").await;
    let names: Vec<&str> = all["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["lock"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ns-a", "ns-b", "ns-c", "other"]);
    let (status, body) = http.get("/v1/fences?limit=x").await;
    assert_eq!(status, 400);
    assert_eq!(code(&body), "bad_request");
    let (status, body) = http.get("/v1/fences?colour=red").await;
    assert_eq!(status, 400, "{body}");
}

/// The start-up line names the server's URL for scripts; the next one names the dashboard
/// for people, and that URL serves it.
#[tokio::test]
async fn the_start_up_output_names_the_dashboard() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(common::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let second = lines.next().unwrap().unwrap();
    let url = palisade_api::listening::parse(&first)
        .expect(&first)
        .to_owned();
    assert_eq!(second, format!("palisade dashboard on {url}/ui"));
    let page = reqwest::get(second.trim_start_matches("palisade dashboard on "))
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    // Its reader gone, the server serves on.
    drop(lines);
    let health = reqwest::get(format!("{url}/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);
    child.kill().unwrap();
    child.wait().unwrap();
}
