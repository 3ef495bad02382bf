//! Checks: asking the world whether a call interrupted in flight took
//! effect, for tools whose effect cannot safely run twice (`check`, an
//! HTTP request; `check_command`, a program). `{key}` and `{args.NAME}` in
//! the check's URL or arguments are filled in from the call: its
//! idempotency key and its arguments (a string as it is, anything else as
//! JSON); in a URL, percent-encoded.

use crate::capture::{Captured, Keep};
use crate::command::CommandTool;
use crate::{json_or_text, with_timeout, CallContext, ToolError};
use replay::spec::{HttpCheck, ToolSpec};

/// What a check answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// The effect happened; this is the call's result.
    Applied(String),
    /// The effect did not happen.
    NotApplied,
    /// The check could not tell (why).
    Unknown(String),
}

/// The most of a check's answer read (its result is a call's result).
fn answer_limit(spec: &ToolSpec) -> usize {
    usize::try_from(spec.max_output_bytes()).unwrap_or(usize::MAX)
}

/// Asks `spec`'s check about the call `ctx` with `args`; `None` if the
/// tool declares no check. Never fails: what goes wrong is an unknown.
pub async fn check(
    spec: &ToolSpec,
    ctx: &CallContext,
    args: &str,
    client: &reqwest::Client,
) -> Option<Checked> {
    let answer = match (&spec.check, &spec.check_command) {
        (Some(check), _) => with_timeout(spec, http(spec, check, ctx, args, client)).await,
        (None, Some(command)) => with_timeout(spec, program(spec, command, ctx, args)).await,
        (None, None) => return None,
    };
    Some(answer.unwrap_or_else(|e| Checked::Unknown(e.to_string())))
}

/// `template` with `{key}` and `{args.NAME}` filled in, each value passed
/// through `encode`.
fn fill(template: &str, ctx: &CallContext, args: &str, encode: impl Fn(&str) -> String) -> String {
    let mut filled = template.replace("{key}", &encode(&ctx.idempotency_key));
    if let Ok(serde_json::Value::Object(fields)) = serde_json::from_str(args) {
        for (name, value) in fields {
            let text = value
                .as_str()
                .map_or_else(|| value.to_string(), String::from);
            filled = filled.replace(&format!("{{args.{name}}}"), &encode(&text));
        }
    }
    filled
}

async fn http(
    spec: &ToolSpec,
    check: &HttpCheck,
    ctx: &CallContext,
    args: &str,
    client: &reqwest::Client,
) -> Result<Checked, ToolError> {
    // A value of "." or ".." (the model's arguments fill the URL) would be
    // a path segment URL parsing collapses, taking the check elsewhere.
    let climbs = std::cell::Cell::new(false);
    let url = fill(&check.url, ctx, args, |v| {
        climbs.set(climbs.get() || v == "." || v == "..");
        url::form_urlencoded::byte_serialize(v.as_bytes()).collect()
    });
    let method = check.method.as_deref().unwrap_or("GET");
    let unknown = |why: String| Ok(Checked::Unknown(format!("{method} {url}: {why}")));
    if climbs.get() {
        return unknown("an argument of \".\" or \"..\" would move the URL out of its path".into());
    }
    let Ok(method_value) = reqwest::Method::from_bytes(method.as_bytes()) else {
        return unknown("bad method".into());
    };
    let request = client
        .request(method_value, &url)
        .header("Idempotency-Key", &ctx.idempotency_key);
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(e) => return unknown(e.to_string()),
    };
    match response.status().as_u16() {
        200 => {}
        404 => return Ok(Checked::NotApplied),
        status => return unknown(format!("answered {status}")),
    }
    let mut body = Captured::default();
    while !body.truncated() {
        match response.chunk().await {
            Ok(Some(chunk)) => body.take(&chunk, Keep::Head(answer_limit(spec))),
            Ok(None) => break,
            Err(e) => return unknown(e.to_string()),
        }
    }
    if body.truncated() {
        return unknown("the answer is longer than the tool's max_output_bytes".into());
    }
    let answer: serde_json::Value = match serde_json::from_str(&body.text(Keep::Head(usize::MAX))) {
        Ok(answer) => answer,
        Err(e) => return unknown(format!("the answer is not JSON: {e}")),
    };
    match answered(&answer) {
        Some(checked) => Ok(checked),
        None => unknown("the answer has no boolean \"applied\"".into()),
    }
}

/// What a check's JSON answer says: `{"applied": true, "result": ...}`
/// (the result as JSON text) or `{"applied": false}`; `None` without a
/// boolean `applied`.
pub(crate) fn answered(answer: &serde_json::Value) -> Option<Checked> {
    match answer.get("applied") {
        Some(serde_json::Value::Bool(true)) => {
            let result = answer.get("result").cloned().unwrap_or_default();
            Some(Checked::Applied(result.to_string()))
        }
        Some(serde_json::Value::Bool(false)) => Some(Checked::NotApplied),
        _ => None,
    }
}

async fn program(
    spec: &ToolSpec,
    command: &[String],
    ctx: &CallContext,
    args: &str,
) -> Result<Checked, ToolError> {
    let words = command.iter().map(|w| fill(w, ctx, args, str::to_string));
    let checker = CommandTool::new(ToolSpec {
        command: Some(words.collect()),
        check_command: None,
        agent: None,
        agent_spec: None,
        ..spec.clone()
    })?;
    let ran = checker.execute(ctx, args).await?;
    Ok(match ran.status.code() {
        Some(0) => Checked::Applied(json_or_text(&ran.output).to_string()),
        Some(3) => Checked::NotApplied,
        _ => Checked::Unknown(format!(
            "{:?} exited {} ({})",
            command[0], ran.status, ran.stderr_tail
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> CallContext {
        CallContext {
            session: uuid::Uuid::nil(),
            call_id: "c1".into(),
            idempotency_key: "mneme-k 1".into(),
            attempt: 1,
            blobs: None,
            cancel: None,
        }
    }

    fn spec(check_command: &[&str]) -> ToolSpec {
        let toml = "name = \"charge\"\nkind = \"command\"\neffect = \"side_effect\"\ncommand = [\"true\"]\ntimeout_secs = 5";
        let mut spec: ToolSpec = toml::from_str(toml).unwrap();
        spec.check_command = Some(check_command.iter().map(|s| s.to_string()).collect());
        spec
    }

    #[test]
    fn placeholders_are_filled_from_the_key_and_the_arguments() {
        let filled = fill(
            "http://h/c?key={key}&who={args.who}&n={args.n}&x={args.none}",
            &ctx(),
            r#"{"who":"a&b","n":3}"#,
            |v| url::form_urlencoded::byte_serialize(v.as_bytes()).collect(),
        );
        assert_eq!(
            filled,
            "http://h/c?key=mneme-k+1&who=a%26b&n=3&x={args.none}"
        );
    }

    #[tokio::test]
    async fn an_argument_cannot_move_the_check_out_of_its_path() {
        // check = { url = "http://h/charges/{args.id}/applied" }, the model's
        // id "..": the URL would collapse to http://h/applied.
        let mut spec = spec(&["true"]);
        spec.check_command = None;
        spec.check = Some(HttpCheck {
            url: "http://127.0.0.1:9/charges/{args.id}/applied".into(),
            method: None,
        });
        let client = reqwest::Client::new();
        for id in ["..", "."] {
            let args = format!(r#"{{"id":"{id}"}}"#);
            let answer = check(&spec, &ctx(), &args, &client).await;
            assert!(
                matches!(&answer, Some(Checked::Unknown(why)) if why.contains("out of its path")),
                "{id}: {answer:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_check_program_answers_by_its_exit_code() {
        let client = reqwest::Client::new();
        let applied = spec(&["sh", "-c", "echo '{\"id\":\"'$1'\"}'", "sh", "{args.who}"]);
        assert_eq!(
            check(&applied, &ctx(), r#"{"who":"ada"}"#, &client).await,
            Some(Checked::Applied(r#"{"id":"ada"}"#.into()))
        );
        let not = spec(&["sh", "-c", "exit 3"]);
        assert_eq!(
            check(&not, &ctx(), "{}", &client).await,
            Some(Checked::NotApplied)
        );
        let unknown = spec(&["sh", "-c", "echo down >&2; exit 1"]);
        match check(&unknown, &ctx(), "{}", &client).await {
            Some(Checked::Unknown(why)) => assert!(why.contains("down"), "{why}"),
            other => panic!("{other:?}"),
        }
        let mut none = spec(&["true"]);
        none.check_command = None;
        assert_eq!(check(&none, &ctx(), "{}", &client).await, None);
    }
}
