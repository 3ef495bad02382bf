//! Where the store is, its versioned schema, and the listener that hears
//! appends.

use deadpool_postgres::Pool;
use eventlog::{AppendListener, LogError};
use futures_util::StreamExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_postgres::{AsyncMessage, NoTls};
use uuid::Uuid;

/// The schema versions this build knows, in order: each script runs once,
/// in one transaction with the bump of `mneme_schema_version`.
pub(crate) const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../migrations/001_event_log.sql")),
    (2, include_str!("../migrations/002_pause_requests.sql")),
    (3, include_str!("../migrations/003_session_keys.sql")),
    (4, include_str!("../migrations/004_shared_records.sql")),
];

/// How long connecting to the server may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one statement may run on the server.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);

/// A parsed store address.
pub(crate) struct Target {
    pub(crate) config: tokio_postgres::Config,
    /// The address without credentials, for messages.
    pub(crate) display: String,
    /// The schema mneme's tables live in, if not the default.
    schema: Option<String>,
    /// How connections are secured.
    pub(crate) tls: Tls,
}

/// TLS to the server: on with `sslmode=require` (server certificates checked
/// against the web's root authorities and `sslrootcert=FILE`, if given), off
/// otherwise.
#[derive(Clone)]
pub(crate) enum Tls {
    Off,
    On(tokio_postgres_rustls::MakeRustlsConnect),
}

impl Tls {
    fn for_mode(
        mode: tokio_postgres::config::SslMode,
        root_cert: Option<&str>,
    ) -> Result<Tls, String> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        if mode != tokio_postgres::config::SslMode::Require {
            return match root_cert {
                Some(_) => Err("sslrootcert is given but sslmode is not require".into()),
                None => Ok(Tls::Off),
            };
        }
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = root_cert {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("sslrootcert {path}: {e}"))?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {path}: {e}"))?;
            }
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls::On(tokio_postgres_rustls::MakeRustlsConnect::new(
            config,
        )))
    }
}

/// The longest schema name: PostgreSQL's channel names hold 63 bytes,
/// and appends are announced on `mneme:<schema>`.
const MAX_SCHEMA_BYTES: usize = 63 - "mneme:".len();

impl Target {
    /// Parses `postgres://…[?…&schema=NAME][&sslmode=require[&sslrootcert=FILE]]`.
    pub(crate) fn parse(url: &str) -> Result<Target, LogError> {
        let invalid = |reason: String| LogError::Backend {
            store: redact(url),
            what: "invalid store address".into(),
            source: Box::<dyn std::error::Error + Send + Sync>::from(reason).into(),
        };
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let (mut schema, mut root_cert) = (None, None);
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            if let Some(name) = pair.strip_prefix("schema=") {
                schema = Some(name.to_string());
            } else if let Some(path) = pair.strip_prefix("sslrootcert=") {
                root_cert = Some(path.to_string());
            } else {
                kept.push(pair);
            }
        }
        if let Some(name) = &schema {
            let ok = name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !ok {
                return Err(invalid(format!(
                    "schema {name:?}: use lowercase letters, digits and _, not starting with a digit"
                )));
            }
            if name.len() > MAX_SCHEMA_BYTES {
                return Err(invalid(format!(
                    "schema {name:?} is {} bytes: at most {MAX_SCHEMA_BYTES}, so the channel \
                     appends are announced on (\"mneme:\" and the schema) fits PostgreSQL's 63",
                    name.len()
                )));
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let mut config: tokio_postgres::Config = rest
            .parse()
            .map_err(|e: tokio_postgres::Error| invalid(e.to_string()))?;
        let tls = Tls::for_mode(config.get_ssl_mode(), root_cert.as_deref()).map_err(invalid)?;
        // An acknowledged append must survive the server's crash, whatever
        // the server's default; a dead peer must not hang a call forever.
        // The append's checks are written for READ COMMITTED: under a
        // stricter default a lost race would surface as a serialization
        // failure instead of a conflict.
        let mut options = format!(
            "{} -c synchronous_commit=on -c default_transaction_isolation=read\\ committed -c statement_timeout={}",
            config.get_options().unwrap_or(""),
            STATEMENT_TIMEOUT.as_millis()
        );
        if let Some(name) = &schema {
            options += &format!(" -c search_path={name}");
        }
        config
            .options(options.trim())
            .application_name("mneme")
            .connect_timeout(CONNECT_TIMEOUT)
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10));
        Ok(Target {
            config,
            display: redact(url),
            schema,
            tls,
        })
    }
}

/// `url` without its password: the one after the user name, a
/// `password=` in the query, or the `password` of a key-value string
/// (`host=… password=…`, which tokio-postgres also accepts).
fn redact(url: &str) -> String {
    let Some(scheme) = url.find("://") else {
        return redact_key_values(url);
    };
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let base = match base.rfind('@') {
        Some(at) if at > scheme => {
            let userinfo = &base[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{}@{}", &base[..scheme + 3], user, &base[at + 1..])
        }
        _ => base.to_string(),
    };
    if query.is_empty() {
        return base;
    }
    let pairs: Vec<&str> = (query.split('&'))
        .map(|pair| match pair.starts_with("password=") {
            true => "password=…",
            false => pair,
        })
        .collect();
    format!("{base}?{}", pairs.join("&"))
}

/// A key-value connection string with the value of each `password` key
/// (quoted or not) replaced by `…`.
fn redact_key_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("password") {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let after_key = from["password".len()..].trim_start();
        let Some(value) = after_key.strip_prefix('=') else {
            out.push_str("password");
            rest = &from["password".len()..];
            continue;
        };
        let value = value.trim_start();
        let end = match value.strip_prefix('\'') {
            // A quoted value ends at the first quote not escaped.
            Some(quoted) => {
                let mut escaped = false;
                let close = quoted.char_indices().find(|&(_, c)| {
                    let closes = c == '\'' && !escaped;
                    escaped = c == '\\' && !escaped;
                    closes
                });
                close.map_or(value.len(), |(i, _)| i + 2)
            }
            None => value.find(char::is_whitespace).unwrap_or(value.len()),
        };
        out.push_str("password=…");
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

/// Brings the store's schema up to the newest version this build knows,
/// under an advisory lock so that daemons starting together migrate once.
pub(crate) async fn migrate(pool: &Pool, store: &str, target: &Target) -> Result<(), LogError> {
    let fail = |what: &str| {
        let what = what.to_string();
        move |source: tokio_postgres::Error| LogError::Backend {
            store: store.to_string(),
            what: what.clone(),
            source: std::sync::Arc::new(source),
        }
    };
    let mut client = pool.get().await.map_err(|source| LogError::Backend {
        store: store.to_string(),
        what: "cannot connect".into(),
        source: std::sync::Arc::new(source),
    })?;
    let tx = client.transaction().await.map_err(fail("migrate"))?;
    tx.batch_execute("SELECT pg_advisory_xact_lock(7236491)")
        .await
        .map_err(fail("lock for migration"))?;
    if let Some(schema) = &target.schema {
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .await
            .map_err(fail("create schema"))?;
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS mneme_schema_version (
            version int PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(fail("create schema version table"))?;
    let found: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM mneme_schema_version",
            &[],
        )
        .await
        .map_err(fail("read schema version"))?
        .get(0);
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if found > known {
        return Err(LogError::SchemaTooNew {
            store: store.to_string(),
            found,
            known,
        });
    }
    for (version, script) in MIGRATIONS.iter().filter(|m| m.0 > found) {
        tx.batch_execute(script)
            .await
            .map_err(fail(&format!("migration {version}")))?;
        tx.execute(
            "INSERT INTO mneme_schema_version (version) VALUES ($1)",
            &[version],
        )
        .await
        .map_err(fail(&format!("record migration {version}")))?;
    }
    tx.commit().await.map_err(fail("commit migrations"))
}

/// Announces committed appends, (session, last seq), to every process
/// listening on the store's channel (`mneme:<schema>`): what arrives within
/// [`ANNOUNCE_EVERY`] of the first append not yet announced (or while the
/// last announcement was under way) goes out together, one statement, the
/// highest seq per session; a session's step of three appends is one
/// announcement, not three notifying transactions. Best effort: an
/// announcement lost (a broken
/// connection, this process killed after a commit) delays a follower until
/// the next one or its own periodic look at the head.
/// How long an append waits for others to be announced with.
const ANNOUNCE_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

pub(crate) async fn announce(
    pool: Pool,
    store: String,
    mut appended: tokio::sync::mpsc::UnboundedReceiver<(Uuid, u64)>,
) {
    while let Some((session, seq)) = appended.recv().await {
        let mut heads = std::collections::BTreeMap::from([(session, seq)]);
        tokio::time::sleep(ANNOUNCE_EVERY).await;
        while let Ok((session, seq)) = appended.try_recv() {
            let head = heads.entry(session).or_default();
            *head = (*head).max(seq);
        }
        let notes: Vec<String> = heads.iter().map(|(s, seq)| format!("{s} {seq}")).collect();
        let sent = async {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            client
                .execute(
                    "SELECT pg_notify('mneme:' || current_schema(), note) FROM unnest($1::text[]) AS note",
                    &[&notes],
                )
                .await
                .map_err(|e| match e.as_db_error() {
                    Some(db) => db.message().to_string(),
                    None => e.to_string(),
                })
        };
        if let Err(e) = sent.await {
            eprintln!("mneme: announcing appends on {store}: {e}");
        }
    }
}

/// Hears every append to the store (announced on a channel named after the
/// schema) and tells `listeners`, reconnecting after a lost
/// connection. Appends made while it was disconnected are not replayed:
/// followers read the log from where they are.
pub(crate) async fn listen(
    config: tokio_postgres::Config,
    tls: Tls,
    store: String,
    listeners: Arc<Mutex<Vec<AppendListener>>>,
) {
    loop {
        let listened = match &tls {
            Tls::Off => listen_once(&config, NoTls, &listeners).await,
            Tls::On(tls) => listen_once(&config, tls.clone(), &listeners).await,
        };
        if let Err(e) = listened {
            eprintln!("mneme: listening to {store} for appends: {e}; retrying");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn listen_once<T>(
    config: &tokio_postgres::Config,
    tls: T,
    listeners: &Mutex<Vec<AppendListener>>,
) -> Result<(), tokio_postgres::Error>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = config.connect(tls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(note) = message {
                if tx.send(note.payload().to_string()).is_err() {
                    break;
                }
            }
        }
    });
    let schema: String = client
        .query_one("SELECT current_schema()", &[])
        .await?
        .get(0);
    client
        .batch_execute(&format!("LISTEN \"mneme:{schema}\""))
        .await?;
    while let Some(payload) = rx.recv().await {
        let Some((session, seq)) = parse_note(&payload) else {
            continue;
        };
        let listeners = listeners.lock().expect("listener lock poisoned").clone();
        for listener in listeners {
            listener(session, seq);
        }
    }
    Ok(())
}

/// `"<session> <seq>"`, as `mneme_append` sends it.
fn parse_note(payload: &str) -> Option<(Uuid, u64)> {
    let (session, seq) = payload.split_once(' ')?;
    Some((session.parse().ok()?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_kept_out_of_messages() {
        assert_eq!(
            redact("postgres://me:secret@db:5432/mneme?schema=a"),
            "postgres://me@db:5432/mneme?schema=a"
        );
        assert_eq!(redact("postgres://db/mneme"), "postgres://db/mneme");
        assert_eq!(
            redact("postgres://me@db/mneme?sslmode=require&password=hunter2&schema=a"),
            "postgres://me@db/mneme?sslmode=require&password=…&schema=a"
        );
        assert_eq!(
            redact("host=db user=me password=hunter2 dbname=mneme"),
            "host=db user=me password=… dbname=mneme"
        );
        assert_eq!(
            redact("host=db password = 'hunt er\\'2' dbname=mneme"),
            "host=db password=… dbname=mneme"
        );
        assert_eq!(redact("password=hunter2"), "password=…");
    }

    #[test]
    fn a_schema_name_too_long_for_the_announcing_channel_is_refused() {
        let fits = "s".repeat(MAX_SCHEMA_BYTES);
        assert!(Target::parse(&format!("postgres://db/mneme?schema={fits}")).is_ok());
        let long = "s".repeat(MAX_SCHEMA_BYTES + 1);
        let err = Target::parse(&format!("postgres://db/mneme?schema={long}"))
            .err()
            .unwrap();
        assert!(format!("{err:?}").contains("at most 57"), "{err:?}");
    }

    #[test]
    fn the_schema_is_taken_out_of_the_address_and_checked() {
        let target = Target::parse("postgres://me@db/mneme?schema=fleet_1").unwrap();
        assert_eq!(target.schema.as_deref(), Some("fleet_1"));
        let err = Target::parse("postgres://me:pw@db/mneme?schema=Drop;")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("invalid store address"), "{err}");
        assert!(!err.contains("pw"), "{err}");
    }

    #[test]
    fn tls_is_on_only_with_sslmode_require_and_a_bad_root_is_named() {
        let plain = Target::parse("postgres://me@db/mneme").unwrap();
        assert!(matches!(plain.tls, Tls::Off));
        let tls = Target::parse("postgres://me@db/mneme?sslmode=require").unwrap();
        assert!(matches!(tls.tls, Tls::On(_)));
        let err =
            Target::parse("postgres://me@db/mneme?sslmode=require&sslrootcert=/nonexistent.pem")
                .err()
                .unwrap();
        let LogError::Backend { source, .. } = err else {
            panic!("{err}")
        };
        assert!(source.to_string().contains("/nonexistent.pem"), "{source}");
    }

    #[test]
    fn notes_parse_and_garbage_is_ignored() {
        let id = Uuid::now_v7();
        assert_eq!(parse_note(&format!("{id} 42")), Some((id, 42)));
        assert_eq!(parse_note("nonsense"), None);
    }
}
