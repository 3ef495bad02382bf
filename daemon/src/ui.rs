//! The web view at `/ui/`: its pages (embedded in the binary: one HTML
//! page, one script, one style sheet, no build step, nothing fetched from
//! elsewhere), and signing a browser in without putting the token in a URL.
//!
//! `mneme ui` asks the daemon (with the bearer token) for a one-time code
//! and prints `/ui/login?code=…`. Opening it within [`CODE_VALID`] trades
//! the code, once, for a sign-in as the name the code was issued to, for
//! [`SIGNED_IN_FOR`], in two halves: a cookie (`HttpOnly`,
//! `SameSite=Strict`) and a key handed to the view's script in the
//! redirect's fragment, which the script keeps in the origin's storage and
//! sends as the `x-mneme-ui` header. The API takes the two together where
//! it takes the token, neither alone: browsers send a cookie to every port
//! of a host (a server on another port of 127.0.0.1 gets it), but storage
//! and fragments stay with this origin, and a page of another origin
//! cannot set the header without the daemon's consent (it gives none). A
//! change must also come with an `Origin`, if sent, naming this daemon, and
//! be one the view makes ([`view_may`]): a sign-in cannot start sessions or
//! send messages (which run tools), only look and decide. Sign-ins live in
//! the daemon's memory: a restart signs everyone out.

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a one-time code may wait to be used.
pub const CODE_VALID: Duration = Duration::from_secs(120);
/// How long a sign-in lasts.
pub const SIGNED_IN_FOR: Duration = Duration::from_secs(12 * 3600);
/// Codes not yet used, at most: issuing one more forgets the oldest.
const MAX_CODES: usize = 64;
/// Browsers signed in at once, at most: one more signs the oldest out.
const MAX_SIGNED_IN: usize = 256;
/// The cookie that carries a sign-in.
const COOKIE: &str = "mneme_ui";
/// The header a browser's changing request must carry.
pub(crate) const ACTION_HEADER: &str = "x-mneme-ui";
/// The longest name a code may be issued to.
pub const MAX_NAME_CHARS: usize = 64;

/// Who a signed-in browser acts as: the name recorded as `by` for what it
/// decides, and the tenant whose sessions it sees (`None`: the operator's
/// sign-in, which sees every session), as the token that asked for its
/// code was.
#[derive(Debug, Clone)]
pub(crate) struct SignedIn(pub(crate) String, pub(crate) Option<String>);

/// A signed-in browser: (name, tenant, digest of the key its script
/// sends).
type Browser = (String, Option<String>, [u8; 32]);

/// One-time codes and the sign-ins they were traded for, each kept as the
/// SHA-256 of its secret.
#[derive(Default)]
pub(crate) struct SignIns {
    /// (name, tenant) by code digest.
    codes: Mutex<Expiring<(String, Option<String>)>>,
    /// Each sign-in, by cookie digest.
    browsers: Mutex<Expiring<Browser>>,
    /// When each name's last forks were made, within [`FORK_WINDOW`].
    forks: Mutex<HashMap<String, std::collections::VecDeque<Instant>>>,
}

/// Forks a sign-in may make in [`FORK_WINDOW`]: each copies a history, so
/// a browser's clicks cannot fill the disk (20 forks of a 48 MiB session
/// took 2.8 GB).
pub const FORKS_PER_WINDOW: usize = 10;
/// The window [`FORKS_PER_WINDOW`] counts in.
pub const FORK_WINDOW: Duration = Duration::from_secs(60);

/// Values by secret digest, each with when it lapses.
struct Expiring<T>(HashMap<[u8; 32], (T, Instant)>);

impl<T> Default for Expiring<T> {
    fn default() -> Self {
        Expiring(HashMap::new())
    }
}

impl<T: Clone> Expiring<T> {
    /// Keeps `value` under `digest` until `lasting` from now, forgetting
    /// lapsed entries, and the one lapsing soonest if `cap` are kept.
    fn insert(&mut self, digest: [u8; 32], value: T, lasting: Duration, cap: usize) {
        let now = Instant::now();
        self.0.retain(|_, (_, until)| *until > now);
        if self.0.len() >= cap {
            if let Some(oldest) = self.0.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| *k) {
                self.0.remove(&oldest);
            }
        }
        self.0.insert(digest, (value, now + lasting));
    }

    /// The value kept under `digest`, unless lapsed.
    fn get(&self, digest: &[u8; 32]) -> Option<T> {
        let (value, until) = self.0.get(digest)?;
        (*until > Instant::now()).then(|| value.clone())
    }
}

fn digest(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// 32 bytes from the kernel's random source, as hex.
fn random_secret() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl SignIns {
    /// A new one-time code that signs a browser in as `name`, seeing
    /// `tenant`'s sessions (`None`: every session); valid once, for
    /// [`CODE_VALID`].
    pub(crate) fn issue(&self, name: &str, tenant: Option<&str>) -> std::io::Result<String> {
        let code = random_secret()?;
        let mut codes = self.codes.lock().expect("codes lock");
        let whose = (name.to_string(), tenant.map(String::from));
        codes.insert(digest(&code), whose, CODE_VALID, MAX_CODES);
        Ok(code)
    }

    /// Signs out every browser signed in for `tenant` (its tokens were
    /// revoked, or it was erased), and forgets its codes.
    pub(crate) fn sign_out_tenant(&self, tenant: &str) {
        let theirs = |t: &Option<String>| t.as_deref() == Some(tenant);
        (self.codes.lock().expect("codes lock").0).retain(|_, ((_, t), _)| !theirs(t));
        (self.browsers.lock().expect("sign-ins lock").0).retain(|_, ((_, t, _), _)| !theirs(t));
    }

    /// Trades `code` for a sign-in: (the cookie's value, the script's key),
    /// once; a used, lapsed or unknown code gets nothing.
    fn redeem(&self, code: &str) -> Option<(String, String)> {
        let (name, tenant) = {
            let mut codes = self.codes.lock().expect("codes lock");
            let whose = codes.get(&digest(code))?;
            codes.0.remove(&digest(code));
            whose
        };
        let (cookie, key) = (random_secret().ok()?, random_secret().ok()?);
        let mut browsers = self.browsers.lock().expect("sign-ins lock");
        let signed_in = (name, tenant, digest(&key));
        browsers.insert(digest(&cookie), signed_in, SIGNED_IN_FOR, MAX_SIGNED_IN);
        Some((cookie, key))
    }

    /// Who the request signs in as, if it carries a live sign-in: a cookie
    /// of one, and its key in the [`ACTION_HEADER`] (digests compared in
    /// constant time). Of several cookies of that name (another port's
    /// page may set one), the one that signs in counts.
    pub(crate) fn who(&self, headers: &HeaderMap) -> Option<SignedIn> {
        let key: [u8; 32] = digest(headers.get(ACTION_HEADER)?.to_str().ok()?);
        let browsers = self.browsers.lock().expect("sign-ins lock");
        cookies(headers, COOKIE)
            .filter_map(|value| browsers.get(&digest(value)))
            .find(|(_, _, expected)| same(expected, &key))
            .map(|(name, tenant, _)| SignedIn(name, tenant))
    }

    /// Counts a fork by `who`, or refuses it (why) if they made
    /// [`FORKS_PER_WINDOW`] in the last [`FORK_WINDOW`].
    pub(crate) fn may_fork(&self, who: &SignedIn) -> Result<(), String> {
        let mut forks = self.forks.lock().expect("forks lock");
        let now = Instant::now();
        forks.retain(|_, made| {
            made.retain(|at| now.duration_since(*at) < FORK_WINDOW);
            !made.is_empty()
        });
        let made = forks.entry(who.0.clone()).or_default();
        if made.len() >= FORKS_PER_WINDOW {
            return Err(format!(
                "{} made {FORKS_PER_WINDOW} forks in the last {} s, the most a sign-in may (each copies a history): try again in a minute, or use the token",
                who.0,
                FORK_WINDOW.as_secs()
            ));
        }
        made.push_back(now);
        Ok(())
    }

    /// Ends the request's sign-in, if it carries a live one (cookie and
    /// key together, as [`SignIns::who`] takes them); whether it did.
    fn sign_out(&self, headers: &HeaderMap) -> bool {
        let Some(key) = headers.get(ACTION_HEADER).and_then(|k| k.to_str().ok()) else {
            return false;
        };
        let key = digest(key);
        let mut browsers = self.browsers.lock().expect("sign-ins lock");
        let signed_in = cookies(headers, COOKIE)
            .map(digest)
            .find(|cookie| browsers.get(cookie).is_some_and(|(_, _, k)| same(&k, &key)));
        signed_in.is_some_and(|cookie| browsers.0.remove(&cookie).is_some())
    }
}

/// Whether two digests are equal, in time that does not depend on where
/// they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The values of cookie `name` in the request's `Cookie` headers.
fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(move |(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Whether the view makes this request: looking (any GET), and the
/// decisions a person takes on a session (pause, resume, cancel, fork,
/// resolve, approve). Starting sessions and sending messages run tools;
/// they need the token.
pub(crate) fn view_may(method: &Method, path: &str) -> bool {
    if matches!(*method, Method::GET | Method::HEAD) {
        return true;
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    *method == Method::POST
        && match parts.as_slice() {
            ["sessions", _, action] => ["pause", "resume", "cancel", "fork"].contains(action),
            ["sessions", _, "calls", _, action] => ["resolve", "approve"].contains(action),
            _ => false,
        }
}

/// Why a signed-in browser's request may not change anything, if it may
/// not: a safe method always may; others need an `Origin` (when sent) that
/// is this daemon's own address.
pub(crate) fn cross_site_refusal(method: &Method, headers: &HeaderMap) -> Option<String> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let origin = headers.get(header::ORIGIN)?.to_str().unwrap_or("");
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let same = origin
        .strip_prefix("http://")
        .is_some_and(|rest| rest == host);
    (!same).then(|| format!("request from origin {origin:?}, not this daemon ({host})"))
}

/// The web view's pages and its sign-in; no token needed to load them (they
/// hold no data: everything shown comes through the API).
pub(crate) fn routes(sign_ins: Arc<SignIns>) -> Router {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| asset("text/html; charset=utf-8", INDEX)))
        .route(
            "/ui/app.js",
            get(|| asset("text/javascript; charset=utf-8", SCRIPT)),
        )
        .route(
            "/ui/app.css",
            get(|| asset("text/css; charset=utf-8", STYLE)),
        )
        .route("/ui/login", get(login))
        .route("/ui/me", get(me))
        .route("/ui/logout", axum::routing::post(logout))
        .with_state(sign_ins)
}

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");

/// What every page of the view is served with: nothing but this daemon may
/// be fetched, run or framed.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    guard(headers);
    response
}

/// The headers that keep a page of the view to itself.
fn guard(headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// The one-time code of a sign-in link.
#[derive(serde::Deserialize)]
struct LoginQuery {
    code: Option<String>,
}

/// `/ui/login?code=…`: a live code signs the browser in and goes to the
/// view; any other is refused, saying how to get a new one.
async fn login(State(sign_ins): State<Arc<SignIns>>, Query(q): Query<LoginQuery>) -> Response {
    let Some((cookie, key)) = q.code.as_deref().and_then(|code| sign_ins.redeem(code)) else {
        let mut response = (
            StatusCode::UNAUTHORIZED,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            REFUSED,
        )
            .into_response();
        guard(response.headers_mut());
        return response;
    };
    // The key goes in the fragment: browsers keep it from servers, and the
    // script moves it into this origin's storage and out of the address.
    let mut response = Redirect::to(&format!("/ui/#signin={key}")).into_response();
    let set = format!(
        "{COOKIE}={cookie}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        SIGNED_IN_FOR.as_secs()
    );
    let headers = response.headers_mut();
    headers.insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&set).expect("a hex cookie is a valid header"),
    );
    guard(headers);
    response
}

/// `/ui/me`: the name the browser is signed in as, or 401.
async fn me(State(sign_ins): State<Arc<SignIns>>, headers: HeaderMap) -> Response {
    match sign_ins.who(&headers) {
        Some(SignedIn(name, tenant)) => {
            axum::Json(serde_json::json!({ "name": name, "tenant": tenant })).into_response()
        }
        None => (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({ "error": "not signed in: run `mneme ui`" })),
        )
            .into_response(),
    }
}

/// `POST /ui/logout`: ends the browser's sign-in (its cookie and key no
/// longer sign in anywhere) and clears its cookie; 401 if it carried none.
/// Like any change a browser makes, refused from another origin.
async fn logout(
    State(sign_ins): State<Arc<SignIns>>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    if let Some(why) = cross_site_refusal(&method, &headers) {
        return (
            StatusCode::FORBIDDEN,
            axum::Json(serde_json::json!({ "error": why })),
        )
            .into_response();
    }
    if !sign_ins.sign_out(&headers) {
        let error = serde_json::json!({ "error": "not signed in" });
        return (StatusCode::UNAUTHORIZED, axum::Json(error)).into_response();
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    let clear = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    let headers = response.headers_mut();
    headers.insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&clear).expect("a valid header"),
    );
    guard(headers);
    response
}

const REFUSED: &str = "<!doctype html><meta charset=utf-8><title>mneme: sign-in refused</title>\
<h1>This sign-in link does not work</h1>\
<p>It was used already, or it is older than two minutes. Run <code>mneme ui</code> for a new one.</p>";

#[cfg(test)]
mod tests {
    use super::*;

    fn signed(cookies: &str, key: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(cookies).unwrap());
        headers.insert(ACTION_HEADER, HeaderValue::from_str(key).unwrap());
        headers
    }

    #[test]
    fn a_code_signs_in_once_with_a_cookie_and_a_key_together() {
        let sign_ins = SignIns::default();
        let code = sign_ins.issue("ada", None).unwrap();
        let (cookie, key) = sign_ins.redeem(&code).unwrap();
        assert!(sign_ins.redeem(&code).is_none(), "a second use is refused");
        let with = |c: &str, k: &str| sign_ins.who(&signed(c, k)).map(|s| s.0);
        assert_eq!(
            with(&format!("other=1; {COOKIE}={cookie}"), &key).unwrap(),
            "ada"
        );
        assert!(
            with(&format!("{COOKIE}={cookie}"), "forged").is_none(),
            "the cookie alone"
        );
        assert!(
            with(&format!("{COOKIE}=forged"), &key).is_none(),
            "the key alone"
        );
        let tossed = format!("{COOKIE}=junk; {COOKIE}={cookie}");
        assert_eq!(with(&tossed, &key).unwrap(), "ada", "a tossed cookie first");
        assert!(sign_ins.redeem("unknown").is_none());
    }

    #[test]
    fn a_sign_in_belongs_to_its_codes_tenant_and_ends_with_it() {
        let sign_ins = SignIns::default();
        let code = sign_ins.issue("ada", Some("acme")).unwrap();
        let (cookie, key) = sign_ins.redeem(&code).unwrap();
        let (own, own_key) = sign_ins
            .redeem(&sign_ins.issue("op", None).unwrap())
            .unwrap();
        let headers = signed(&format!("{COOKIE}={cookie}"), &key);
        let who = sign_ins.who(&headers).unwrap();
        assert_eq!((who.0.as_str(), who.1.as_deref()), ("ada", Some("acme")));
        let unused = sign_ins.issue("bob", Some("acme")).unwrap();
        sign_ins.sign_out_tenant("acme");
        assert!(
            sign_ins.who(&headers).is_none(),
            "signed out with its tenant"
        );
        assert!(sign_ins.redeem(&unused).is_none(), "its codes forgotten");
        let operator = signed(&format!("{COOKIE}={own}"), &own_key);
        assert!(sign_ins.who(&operator).is_some(), "another's sign-in stays");
    }

    #[test]
    fn a_sign_in_may_look_and_decide_but_not_start_or_send() {
        assert!(view_may(&Method::GET, "/sessions"));
        assert!(!view_may(&Method::POST, "/sessions/x/approve"));
        assert!(view_may(&Method::POST, "/sessions/x/calls/c/approve"));
        assert!(view_may(&Method::POST, "/sessions/x/pause"));
        assert!(view_may(&Method::POST, "/sessions/x/fork"));
        assert!(!view_may(&Method::POST, "/sessions"));
        assert!(!view_may(&Method::POST, "/sessions/x/messages"));
        assert!(!view_may(&Method::POST, "/ui/codes"));
        assert!(!view_may(&Method::DELETE, "/sessions/x"));
    }

    #[test]
    fn a_sign_in_forks_a_few_times_a_minute_and_each_name_counts_alone() {
        let sign_ins = SignIns::default();
        let (ada, bob) = (SignedIn("ada".into(), None), SignedIn("bob".into(), None));
        for _ in 0..FORKS_PER_WINDOW {
            sign_ins.may_fork(&ada).unwrap();
        }
        let refused = sign_ins.may_fork(&ada).unwrap_err();
        assert!(
            refused.contains("ada made 10 forks in the last 60 s"),
            "{refused}"
        );
        assert!(sign_ins.may_fork(&bob).is_ok(), "another name");
    }

    #[test]
    fn signing_out_takes_the_cookie_and_key_together_and_ends_the_sign_in() {
        let sign_ins = SignIns::default();
        let (cookie, key) = sign_ins
            .redeem(&sign_ins.issue("ada", None).unwrap())
            .unwrap();
        let cookie = format!("{COOKIE}={cookie}");
        assert!(
            !sign_ins.sign_out(&signed(&cookie, "forged")),
            "the cookie alone"
        );
        assert!(sign_ins.who(&signed(&cookie, &key)).is_some());
        assert!(sign_ins.sign_out(&signed(&cookie, &key)));
        assert!(sign_ins.who(&signed(&cookie, &key)).is_none(), "signed out");
        assert!(!sign_ins.sign_out(&signed(&cookie, &key)), "once");
    }

    #[test]
    fn the_oldest_code_makes_room() {
        let sign_ins = SignIns::default();
        let first = sign_ins.issue("a", None).unwrap();
        for _ in 0..MAX_CODES {
            sign_ins.issue("b", None).unwrap();
        }
        assert!(sign_ins.redeem(&first).is_none());
        assert_eq!(sign_ins.codes.lock().unwrap().0.len(), MAX_CODES);
    }

    #[test]
    fn changes_from_other_sites_are_refused() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:7878"));
        assert!(cross_site_refusal(&Method::GET, &headers).is_none());
        assert!(cross_site_refusal(&Method::POST, &headers).is_none());
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(cross_site_refusal(&Method::POST, &headers)
            .unwrap()
            .contains("evil.example"));
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:7878"),
        );
        assert!(cross_site_refusal(&Method::POST, &headers).is_none());
    }
}
