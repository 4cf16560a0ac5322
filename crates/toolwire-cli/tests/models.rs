//! Named models from the config file, run as a user would: the real
//! binary, a real SQLite file, mock model servers on loopback (OpenAI's
//! and Anthropic's wire formats) recording what they were asked.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use serde_json::Value;
use toolwire_test_support::{MockServer, Reply, anthropic_sse, openai_sse};

fn toolwire(dir: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolwire"));
    cmd.current_dir(dir)
        .env_remove("RUST_LOG")
        .env("XDG_DATA_HOME", dir.join(".xdg"));
    for (k, _) in std::env::vars() {
        if k.starts_with("TOOLWIRE_") || k.ends_with("_API_KEY") {
            cmd.env_remove(k);
        }
    }
    cmd.kill_on_drop(true);
    cmd
}

fn config(dir: &Path, toml: &str) -> String {
    let path = dir.join("toolwire.toml");
    std::fs::write(&path, toml).unwrap();
    path.display().to_string()
}

/// `exec --json` with `args`: the exit status, the events, stderr.
async fn exec(dir: &Path, args: &[&str]) -> (bool, Vec<Value>, String) {
    let out = toolwire(dir)
        .arg("exec")
        .arg("--json")
        .args(args)
        .output()
        .await
        .unwrap();
    let events = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (
        out.status.success(),
        events,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The model recorded on the turn's stored assistant messages.
fn answered_by(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "assistant_message_created")
        .map(|e| e["message"]["model"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_names_the_configured_model_that_answers() {
    let fast = MockServer::start(vec![Reply::sse(openai_sse("Fast here.", &[]))]).await;
    let deep = MockServer::start(vec![Reply::sse(anthropic_sse("Deep here.", &[]))]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        dir.path(),
        &format!(
            r#"
            default_model = "fast"
            [models.fast]
            provider = "openai"
            model = "gpt-4o-mini"
            base_url = "{}"
            [models.deep]
            provider = "anthropic"
            model = "claude-sonnet-4-5"
            base_url = "{}"
            max_output = 1234
            "#,
            fast.url, deep.url
        ),
    );

    let (ok, events, stderr) = exec(dir.path(), &["--config", &config, "hello"]).await;
    assert!(ok, "{stderr}");
    assert_eq!(answered_by(&events), ["fast"]);
    assert_eq!(fast.received().len(), 1);
    assert_eq!(fast.received()[0].body["model"], "gpt-4o-mini");
    assert!(deep.received().is_empty());

    let (ok, events, stderr) = exec(
        dir.path(),
        &["--config", &config, "--model", "deep", "hello"],
    )
    .await;
    assert!(ok, "{stderr}");
    assert_eq!(answered_by(&events), ["deep"]);
    let asked = deep.received();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].path, "/v1/messages");
    assert_eq!(asked[0].body["model"], "claude-sonnet-4-5");
    // Its own output cap, not the deployment's.
    assert_eq!(asked[0].body["max_tokens"], 1234);
    assert_eq!(fast.received().len(), 1);

    // The same through the environment.
    let out = toolwire(dir.path())
        .args(["exec", "--config", &config, "hi"])
        .env("TOOLWIRE_MODEL", "deep")
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Deep here.\n");
    assert_eq!(deep.received().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_default_is_answered_by_its_fallback() {
    // Anthropic's 529, asking for no wait, so the provider's retries pass
    // at once.
    let overloaded = MockServer::start(vec![Reply::Status {
        code: 529,
        headers: vec![("retry-after".into(), "0".into())],
        body: r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            .into(),
    }])
    .await;
    let spare = MockServer::start(vec![Reply::sse(openai_sse("Spare here.", &[]))]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        dir.path(),
        &format!(
            r#"
            default_model = "main"
            [models.main]
            provider = "anthropic"
            model = "claude-sonnet-4-5"
            base_url = "{}"
            fallback = ["spare"]
            [models.spare]
            provider = "openai"
            model = "gpt-4o-mini"
            base_url = "{}"
            "#,
            overloaded.url, spare.url
        ),
    );
    let (ok, events, stderr) = exec(dir.path(), &["--config", &config, "hello"]).await;
    assert!(ok, "{stderr}");
    assert_eq!(answered_by(&events), ["spare"]);
    let fallback = events
        .iter()
        .find(|e| e["type"] == "model_fallback")
        .expect("a model_fallback event");
    assert_eq!(fallback["from"], "main");
    assert_eq!(fallback["to"], "spare");
    assert_eq!(fallback["reason"], "overloaded");
    // The provider retried (4 retries), then the fallback was asked once.
    assert_eq!(overloaded.received().len(), 5);
    assert_eq!(spare.received().len(), 1);

    // Without --json, the terminal says so.
    let out = toolwire(dir.path())
        .args(["exec", "--config", &config, "again"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("(model main overloaded; spare answers)"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_configured_wrong_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for (toml, says) in [
        (
            "[models.x]\nprovider = \"gemini\"\nmodel = \"g\"\n",
            "[models.x] provider = \"gemini\" is not a provider",
        ),
        (
            "[models.x]\nprovider = \"anthropic\"\nmodel = \"claude\"\n\
             api_key_env = \"TOOLWIRE_MODELS_TEST_UNSET_KEY\"\n",
            "model `x`: no API key: set TOOLWIRE_MODELS_TEST_UNSET_KEY",
        ),
    ] {
        let config = config(dir.path(), toml);
        let (ok, _, stderr) = exec(dir.path(), &["--config", &config, "hello"]).await;
        assert!(!ok, "{toml} was accepted");
        assert!(stderr.contains(says), "{toml}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // Nothing was opened.
    assert!(!dir.path().join(".xdg/toolwire/toolwire.db").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_image_reaches_a_vision_model_and_a_bad_file_is_named() {
    let vision = MockServer::start(vec![Reply::sse(openai_sse("A tiny picture.", &[]))]).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        dir.path(),
        &format!(
            r#"
            default_model = "eyes"
            [models.eyes]
            provider = "openai"
            model = "gpt-4o"
            base_url = "{}"
            vision = true
            "#,
            vision.url
        ),
    );
    let png: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR a tiny png";
    std::fs::write(dir.path().join("shot.png"), png).unwrap();

    let (ok, _, stderr) = exec(
        dir.path(),
        &["--config", &config, "--image", "shot.png", "what is this?"],
    )
    .await;
    assert!(ok, "{stderr}");
    let asked = vision.received();
    assert_eq!(asked.len(), 1);
    let user = asked[0].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap()
        .clone();
    let parts = user["content"].as_array().unwrap();
    assert_eq!(parts[0]["text"], "what is this?");
    use base64::Engine as _;
    let url = format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(png)
    );
    assert_eq!(parts[1]["image_url"]["url"], url, "{user}");

    // Not an image: refused before anything is sent, naming the file.
    std::fs::write(dir.path().join("notes.txt"), "hello").unwrap();
    let (ok, _, stderr) = exec(
        dir.path(),
        &["--config", &config, "--image", "notes.txt", "and this?"],
    )
    .await;
    assert!(!ok);
    assert!(stderr.contains("--image notes.txt"), "{stderr}");
    let (ok, _, stderr) = exec(
        dir.path(),
        &["--config", &config, "--image", "missing.png", "and this?"],
    )
    .await;
    assert!(!ok);
    assert!(stderr.contains("--image missing.png"), "{stderr}");
    assert_eq!(vision.received().len(), 1);
}
