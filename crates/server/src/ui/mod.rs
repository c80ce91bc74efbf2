//! The dashboard at `/ui`: one HTML page, one script and one style sheet, compiled into
//! the binary and served as they are.
//!
//! The files hold no data, so they are public even with authentication on; the page asks
//! for the bearer key, keeps it in the tab's `sessionStorage` only, and sends it with
//! every call it makes to the v1 API, which filters what each principal sees as it does
//! for any client. Every answer carries a Content-Security-Policy that lets the page load
//! and connect to this server only: no inline script, no other origin, no framing.
//!
//! The routes sit outside the API's middleware (authentication, request timing): a
//! request to the API pays nothing for them, and nobody having the page open costs the
//! server nothing at all. What an open page costs is its own API calls: a page of 50
//! locks, one of 50 namespaces and one of 20 locks' marks by resource every 2 seconds, a
//! scrape of `/metrics` as often, and one events stream.
//!
//! What it does not do: it keeps no history (the chart holds the last 60 samples, the
//! feed the last 200 events, both gone on reload), and it never lists everything at once.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

/// The page's Content-Security-Policy: its own script, style and API, nothing else.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

const INDEX: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("app.css");

/// The dashboard's routes.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/ui",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route("/ui/", get(|| async { Redirect::permanent("/ui") }))
        // A person who opens the server's own URL in a browser: the dashboard. Temporary,
        // so that a later version may serve something else there.
        .route("/", get(|| async { Redirect::temporary("/ui") }))
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // A new binary may bring new files under the same names.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files() {
        for text in [INDEX, SCRIPT, STYLE] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
        assert!(INDEX.contains("src=\"/ui/app.js\"") && INDEX.contains("href=\"/ui/app.css\""));
        // No inline script or style: the policy would refuse them.
        assert!(!INDEX.contains("<script>") && !INDEX.contains("style="));
    }
}
