//! `int4 serve`: an OpenAI-compatible HTTP server over one loaded [`Engine`], with continuous batching.
//!
//! The HTTP side ([`axum`] on a small tokio runtime) parses and checks requests ([`api`]), renders chat
//! templates and tokenizes on its blocking pool, and answers — JSON, or server-sent events when
//! streaming. It never runs the model: one scheduler thread ([`scheduler`]) owns it and runs every
//! request's sequence in shared steps, each row on the kernels it would run alone, so an answer does not
//! depend on what else is running. Endpoints: `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models`, `GET /health`, `GET /metrics` ([`metrics`]).
//!
//! Admission: each sequence's KV cache (prompt plus `max_tokens` positions) must fit the budget beside
//! the running ones, else it waits in a bounded queue; a full queue is a 429 with `Retry-After`; a request
//! larger than the model's context or the whole budget is a 400 `context_length_exceeded`. A client that
//! disconnects has its sequence dropped before the next step. SIGTERM or SIGINT stops accepting, lets
//! running requests finish until the shutdown timeout, ends the rest with an error event (never a
//! `[DONE]`), and returns.

pub mod api;
pub mod metrics;
mod prefix;
pub mod scheduler;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use int4::{Engine, FinishReason, GenerationRequest, Prompt, TokenEvent, TokenLogprobs};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tower::ServiceExt;

use crate::api::{ApiError, Endpoint, Parsed, PromptInput};
use crate::metrics::{Metrics, Outcome};
use crate::scheduler::{Command, Counts, Job, Shared, Update};

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind (default 127.0.0.1).
    pub host: String,
    /// Port (default 8080; 0 picks a free one, printed on start).
    pub port: u16,
    /// The model's name in the API (`model` in requests, `/v1/models`).
    pub model_name: String,
    /// Bytes of KV cache the running sequences may hold together.
    pub kv_budget: usize,
    /// Prompt caches kept for later requests that begin the same way (whole 256-position chunks); 0 keeps
    /// none. They count against `kv_budget` and give way first when a request needs room.
    pub prefix_cache: usize,
    /// Requests that may wait for admission; more get 429.
    pub max_queue: usize,
    /// How long a shutdown waits for running requests.
    pub shutdown_timeout: Duration,
    /// The largest request body, in bytes.
    pub max_body_bytes: usize,
    /// How long a client may take to send a request's headers, and then its body: a client that sends
    /// slower is cut off (headers) or answered 408 (body), so slow clients cannot hold connections.
    pub request_read_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog until one closes.
    pub max_connections: usize,
}

impl ServeOptions {
    /// The defaults for `model_name`: 127.0.0.1:8080, a KV budget of 4 GiB (or a third of the memory
    /// available, if less), 16 kept prompt caches, 256 queued requests, 30 s to shut down, 8 MiB bodies, 10 s to send a request's
    /// headers and 10 s its body, 1024 connections.
    pub fn new(model_name: impl Into<String>) -> Self {
        let available = available_memory().map_or(usize::MAX, |m| m / 3);
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8080,
            model_name: model_name.into(),
            kv_budget: (4usize << 30).min(available),
            prefix_cache: 16,
            max_queue: 256,
            shutdown_timeout: Duration::from_secs(30),
            max_body_bytes: 8 << 20,
            request_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
        }
    }
}

fn available_memory() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: usize = s.lines().find(|l| l.starts_with("MemAvailable:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Why the server could not run.
#[derive(Debug)]
pub struct ServeError(String);

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ServeError {}

struct AppState {
    engine: Arc<Engine>,
    commands: std::sync::Mutex<std::sync::mpsc::Sender<Command>>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    opts: ServeOptions,
    created: u64,
    ids: AtomicU64,
}

/// Serves `engine` until SIGTERM or SIGINT; `on_listen` is told the bound address.
pub fn serve(engine: Engine, opts: ServeOptions, on_listen: impl FnOnce(SocketAddr)) -> Result<(), ServeError> {
    let engine = Arc::new(engine);
    let shared = Arc::new(Shared::default());
    let metrics = Arc::new(Metrics::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let scheduler = {
        let (engine, shared, metrics) = (engine.clone(), shared.clone(), metrics.clone());
        let limits = scheduler::Limits { kv_budget: opts.kv_budget, prefix_cache: opts.prefix_cache };
        std::thread::Builder::new()
            .name("int4-scheduler".into())
            .spawn(move || scheduler::run(&engine, rx, shared, metrics, limits))
            .map_err(|e| ServeError(format!("could not start the scheduler thread: {e}")))?
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(2)
        .thread_name("int4-http")
        .enable_all()
        .build()
        .map_err(|e| ServeError(format!("could not start the HTTP runtime: {e}")))?;
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let timeout = opts.shutdown_timeout;
    let state = Arc::new(AppState {
        engine,
        commands: std::sync::Mutex::new(tx),
        shared: shared.clone(),
        metrics,
        opts: opts.clone(),
        created,
        ids: AtomicU64::new(0),
    });
    let result = runtime.block_on(async move {
        let addr = format!("{}:{}", opts.host, opts.port);
        let listener =
            tokio::net::TcpListener::bind(&addr).await.map_err(|e| ServeError(format!("cannot bind {addr}: {e}")))?;
        let bound = listener.local_addr().map_err(|e| ServeError(format!("{addr}: {e}")))?;
        on_listen(bound);
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .route("/v1/completions", post(completions))
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .route("/metrics", get(prometheus))
            .layer(DefaultBodyLimit::disable())
            .with_state(state.clone());
        let stop_state = state.clone();
        let stop = async move {
            shutdown_signal().await;
            eprintln!("[int4 serve] shutting down: finishing running requests (up to {} s)", timeout.as_secs());
            stop_state.shared.draining.store(true, Ordering::SeqCst);
            if let Ok(c) = stop_state.commands.lock() {
                let _ = c.send(Command::Shutdown(Instant::now() + timeout));
            }
        };
        let server = accept_loop(listener, app, opts.request_read_timeout, opts.max_connections, stop);
        // Past the deadline the scheduler has ended every stream; give the connections a moment to close.
        let watchdog = async {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if shared.stopped.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    return;
                }
            }
        };
        tokio::select! {
            () = server => Ok(()),
            () = watchdog => Ok(()),
        }
    });
    // The runtime's tasks hold the last handles on the command channel: with them gone, an idle
    // scheduler returns.
    runtime.shutdown_timeout(Duration::from_secs(1));
    let _ = scheduler.join();
    result
}

/// Serves `app` on every connection `listener` accepts, HTTP/1.1 with keep-alive, until `stop` completes;
/// then stops accepting and lets open connections finish their requests (the scheduler's deadline ends
/// the streams of a shutdown that runs out of time). A connection must send each request's headers
/// within `header_timeout`; at most `max_connections` are served at once.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    header_timeout: Duration,
    max_connections: usize,
    stop: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let permits = Arc::new(tokio::sync::Semaphore::new(max_connections.max(1)));
    let mut stop = std::pin::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            () = &mut stop => break,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or a connection reset before it was taken: wait and go on.
                    eprintln!("[int4 serve] accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(
            app.clone().map_request(|r: axum::http::Request<hyper::body::Incoming>| r.map(axum::body::Body::new)),
        );
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.shared.draining.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    } else {
        (StatusCode::OK, "ok\n").into_response()
    }
}

async fn prometheus(State(st): State<Arc<AppState>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], st.metrics.render()).into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{"id": st.opts.model_name, "object": "model", "created": st.created, "owned_by": "int4"}],
    }))
    .into_response()
}

async fn chat_completions(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    handle(st, Endpoint::Chat, &headers, body).await
}

async fn completions(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    handle(st, Endpoint::Completion, &headers, body).await
}

/// The request's body, read within the server's read timeout and size limit: 408 or 413 otherwise (413
/// before reading when the declared length is over the limit).
async fn read_body(st: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let limit = st.opts.max_body_bytes;
    let timeout = st.opts.request_read_timeout;
    let too_large = || ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        ..ApiError::bad_body(format!("the request body is larger than {limit} bytes"))
    };
    let declared = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if over {
                Err(too_large())
            } else {
                Err(ApiError::bad_body(format!("the request body could not be read: {e}")))
            }
        }
        Err(_) => Err(ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            ..ApiError::bad_body(format!("the request body did not arrive within {} s", timeout.as_secs_f64()))
        }),
    }
}

/// One request's sequences, ready for the scheduler.
struct Prepared {
    request: GenerationRequest,
    prompt_len: usize,
    positions: usize,
}

async fn handle(st: Arc<AppState>, endpoint: Endpoint, headers: &HeaderMap, body: Body) -> Response {
    let body = match read_body(&st, headers, body).await {
        Ok(b) => b,
        Err(e) => {
            st.metrics.count_request(Outcome::Rejected);
            return e.into_response();
        }
    };
    match submit(&st, endpoint, &body).await {
        Ok(r) => r,
        Err(e) => {
            st.metrics.count_request(Outcome::Rejected);
            e.into_response()
        }
    }
}

async fn submit(st: &Arc<AppState>, endpoint: Endpoint, body: &[u8]) -> Result<Response, ApiError> {
    // The time to first token counts from here: preparing the prompt (template, tokenizer) is part of it.
    let received = Instant::now();
    let parsed = api::parse(endpoint, body)?;
    if parsed.model != st.opts.model_name {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{}` does not exist; this server serves `{}`.",
                parsed.model, st.opts.model_name
            ),
            kind: "not_found_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        });
    }
    if st.shared.draining.load(Ordering::SeqCst) {
        return Err(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is shutting down".into(),
            kind: "server_error",
            param: None,
            code: None,
        });
    }
    let (engine, p, budget) = (st.engine.clone(), parsed.clone(), st.opts.kv_budget);
    let prepared =
        tokio::task::spawn_blocking(move || prepare(&engine, &p, budget)).await.map_err(|e| ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            ..ApiError::bad_body(e.to_string())
        })??;
    let queued = st.shared.queued.load(Ordering::SeqCst);
    if queued + prepared.len() > st.opts.max_queue {
        return Err(ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: format!(
                "{queued} requests are waiting, the most this server queues ({}); retry shortly",
                st.opts.max_queue
            ),
            kind: "rate_limit_error",
            param: None,
            code: None,
        });
    }
    let request_answered = Arc::new(AtomicBool::new(false));
    let mut receivers = Vec::new();
    for p in prepared {
        let (tx, rx) = unbounded_channel();
        st.shared.queued.fetch_add(1, Ordering::SeqCst);
        let job = Job {
            request: p.request,
            prompt_len: p.prompt_len,
            positions: p.positions,
            updates: tx,
            received,
            request_answered: request_answered.clone(),
        };
        let sent = st.commands.lock().map(|c| c.send(Command::Run(Box::new(job))).is_ok()).unwrap_or(false);
        if !sent {
            st.shared.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "the scheduler has stopped".into(),
                kind: "server_error",
                param: None,
                code: None,
            });
        }
        receivers.push(rx);
    }
    let id = format!(
        "{}-{:x}{:04x}",
        if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" },
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis()),
        st.ids.fetch_add(1, Ordering::Relaxed) & 0xffff
    );
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let reply = Reply { id, created, model: st.opts.model_name.clone(), parsed, engine: st.engine.clone() };
    if reply.parsed.stream { stream(st.clone(), reply, receivers).await } else { collect(st, reply, receivers).await }
}

/// Tokenizes each prompt and checks the request against the model, its context and the KV budget.
fn prepare(engine: &Engine, p: &Parsed, kv_budget: usize) -> Result<Vec<Prepared>, ApiError> {
    let context = engine.model.config().max_position_embeddings;
    let mut out = Vec::new();
    for input in &p.prompts {
        let param = if p.endpoint == Endpoint::Chat { "messages" } else { "prompt" };
        let ids = match input {
            PromptInput::Chat(m, o) => engine.text.apply_chat_template(m, o).and_then(|t| engine.text.encode(&t)),
            PromptInput::Text(t) => engine.text.encode(t),
            PromptInput::Ids(ids) => Ok(ids.clone()),
        }
        .map_err(|e| ApiError::bad(param, e.to_string()))?;
        let prompt_len = ids.len();
        if prompt_len >= context {
            return Err(ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::bad(param, format!("the prompt is {prompt_len} tokens; the model's context is {context}"))
            });
        }
        let max_tokens = p.generation.max_tokens.or(engine.defaults.max_tokens).unwrap_or(context - prompt_len);
        if prompt_len + max_tokens > context {
            return Err(ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::bad(
                    "max_tokens",
                    format!(
                        "the prompt ({prompt_len} tokens) and max_tokens ({max_tokens}) exceed the model's context ({context})"
                    ),
                )
            });
        }
        let positions = prompt_len + max_tokens;
        let bytes = engine.model.kv_cache_bytes(positions);
        if bytes > kv_budget {
            return Err(ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::bad(
                    "max_tokens",
                    format!(
                        "{positions} positions need {bytes} bytes of KV cache, more than this server's budget ({kv_budget})"
                    ),
                )
            });
        }
        let request =
            GenerationRequest { prompt: Prompt::Ids(ids), max_tokens: Some(max_tokens), ..p.generation.clone() };
        // Every value checked now, so a bad one is a 400 naming it, not a failed stream.
        engine.prepare(request.clone()).map_err(|e| {
            let param = match e.context() {
                "top_logprobs" if p.endpoint == Endpoint::Completion => "logprobs".to_string(),
                "prompt" => param.to_string(),
                c => c.to_string(),
            };
            ApiError::bad(param, e.to_string())
        })?;
        out.push(Prepared { request, prompt_len, positions });
    }
    Ok(out)
}

/// What a response needs besides the sequences' updates.
struct Reply {
    id: String,
    created: u64,
    model: String,
    parsed: Parsed,
    engine: Arc<Engine>,
}

/// One choice as it accumulates.
#[derive(Default)]
struct Choice {
    text: String,
    tokens: Vec<(u32, Option<TokenLogprobs>)>,
    finish: Option<FinishReason>,
    usage: Counts,
}

impl Reply {
    fn token_text(&self, id: u32) -> String {
        self.engine.text.token_text(id).unwrap_or_default()
    }

    /// Chat's `logprobs.content` entries for `tokens`.
    fn chat_logprobs(&self, tokens: &[(u32, Option<TokenLogprobs>)]) -> Value {
        let entry = |id: u32, lp: f32| {
            let t = self.token_text(id);
            json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
        };
        let content: Vec<Value> = tokens
            .iter()
            .filter_map(|(id, lp)| {
                let lp = lp.as_ref()?;
                let mut e = entry(*id, lp.logprob);
                e["top_logprobs"] = lp.top.iter().map(|&(t, p)| entry(t, p)).collect();
                Some(e)
            })
            .collect();
        json!({"content": content})
    }

    /// Completions' `logprobs` for `tokens`, their text starting at `offset`.
    fn completion_logprobs(&self, tokens: &[(u32, Option<TokenLogprobs>)], mut offset: usize) -> Value {
        let (mut toks, mut lps, mut tops, mut offs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (id, lp) in tokens {
            let Some(lp) = lp else { continue };
            let t = self.token_text(*id);
            offs.push(offset);
            offset += t.len();
            toks.push(t);
            lps.push(lp.logprob);
            let top: serde_json::Map<String, Value> =
                lp.top.iter().map(|&(t, p)| (self.token_text(t), json!(p))).collect();
            tops.push(Value::Object(top));
        }
        json!({"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
    }

    fn usage(&self, c: Counts) -> Value {
        let u = c.usage;
        json!({
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": c.cached_prompt_tokens},
        })
    }
}

fn failed(message: String) -> ApiError {
    ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, kind: "server_error", ..ApiError::bad_body(message) }
}

async fn collect(
    st: &Arc<AppState>,
    reply: Reply,
    receivers: Vec<UnboundedReceiver<Update>>,
) -> Result<Response, ApiError> {
    let mut choices: Vec<Choice> = Vec::new();
    for mut rx in receivers {
        let mut c = Choice::default();
        loop {
            match rx.recv().await {
                Some(Update::Token(ev)) => {
                    c.text.push_str(&ev.text);
                    c.tokens.push((ev.id, ev.logprobs));
                }
                Some(Update::Done(reason, usage)) => {
                    c.finish = Some(reason);
                    c.usage = usage;
                    break;
                }
                Some(Update::Failed(m)) => {
                    st.metrics.count_request(Outcome::Failed);
                    return Err(failed(m));
                }
                None => {
                    st.metrics.count_request(Outcome::Failed);
                    return Err(failed("the scheduler ended this request".into()));
                }
            }
        }
        choices.push(c);
    }
    let total = choices.iter().fold(Counts::default(), |a, c| a.plus(c.usage));
    let logprobs = reply.parsed.generation.logprobs.is_some();
    let body = match reply.parsed.endpoint {
        Endpoint::Chat => {
            let c = &choices[0];
            json!({
                "id": reply.id, "object": "chat.completion", "created": reply.created, "model": reply.model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": if logprobs { reply.chat_logprobs(&c.tokens) } else { Value::Null },
                    "finish_reason": c.finish.as_ref().map(FinishReason::openai_name),
                }],
                "usage": reply.usage(total),
            })
        }
        Endpoint::Completion => json!({
            "id": reply.id, "object": "text_completion", "created": reply.created, "model": reply.model,
            "choices": choices.iter().enumerate().map(|(i, c)| json!({
                "index": i,
                "text": c.text,
                "logprobs": if logprobs { reply.completion_logprobs(&c.tokens, 0) } else { Value::Null },
                "finish_reason": c.finish.as_ref().map(FinishReason::openai_name),
            })).collect::<Vec<_>>(),
            "usage": reply.usage(total),
        }),
    };
    st.metrics.count_request(Outcome::Ok);
    Ok(axum::Json(body).into_response())
}

async fn stream(
    st: Arc<AppState>,
    reply: Reply,
    receivers: Vec<UnboundedReceiver<Update>>,
) -> Result<Response, ApiError> {
    let n = receivers.len();
    let mut merged = futures_util::stream::select_all(
        receivers
            .into_iter()
            .enumerate()
            .map(|(i, rx)| tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(move |u| (i, u))),
    );
    // The first update decides the status: a request that fails before its first token is an HTTP error.
    let first = merged.next().await;
    match &first {
        Some((_, Update::Failed(m))) => {
            st.metrics.count_request(Outcome::Failed);
            return Err(failed(m.clone()));
        }
        None => {
            st.metrics.count_request(Outcome::Failed);
            return Err(failed("the scheduler ended this request".into()));
        }
        _ => {}
    }
    let reply = Arc::new(reply);
    let state = StreamState {
        reply: reply.clone(),
        offsets: vec![0; n],
        done: 0,
        usage: Counts::default(),
        n,
        finished: false,
    };
    let head: Vec<Event> = if reply.parsed.endpoint == Endpoint::Chat {
        vec![chunk(
            &reply,
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
        )]
    } else {
        Vec::new()
    };
    let metrics = st.metrics.clone();
    let rest = futures_util::stream::iter(first).chain(merged);
    let events = futures_util::stream::iter(head.into_iter().map(Ok::<Event, Infallible>)).chain(
        futures_util::stream::unfold((rest, state), move |(mut rest, mut s)| {
            let metrics = metrics.clone();
            async move {
                if s.finished {
                    return None;
                }
                let mut out = Vec::new();
                match rest.next().await {
                    Some((i, Update::Token(ev))) => out.extend(s.token(i, ev)),
                    Some((i, Update::Done(reason, usage))) => {
                        out.extend(s.done(i, reason, usage));
                        if s.done == s.n {
                            if s.reply.parsed.include_usage {
                                out.push(chunk_with(&s.reply, json!([]), s.reply.usage(s.usage)));
                            }
                            out.push(Event::default().data("[DONE]"));
                            s.finished = true;
                            metrics.count_request(Outcome::Ok);
                        }
                    }
                    Some((_, Update::Failed(m))) => {
                        // An error event and the end of the stream, never a [DONE].
                        out.push(Event::default().data(failed(m).body().to_string()));
                        s.finished = true;
                        metrics.count_request(Outcome::Failed);
                    }
                    None => {
                        out.push(
                            Event::default().data(failed("the scheduler ended this request".into()).body().to_string()),
                        );
                        s.finished = true;
                        metrics.count_request(Outcome::Failed);
                    }
                }
                Some((futures_util::stream::iter(out.into_iter().map(Ok::<Event, Infallible>)), (rest, s)))
            }
        })
        .flatten(),
    );
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

/// A streamed response's state: where each choice's text stands and the usage so far.
struct StreamState {
    reply: Arc<Reply>,
    offsets: Vec<usize>,
    done: usize,
    usage: Counts,
    n: usize,
    finished: bool,
}

impl StreamState {
    fn token(&mut self, i: usize, ev: TokenEvent) -> Option<Event> {
        let r = &self.reply;
        let logprobs = r.parsed.generation.logprobs.is_some();
        if ev.text.is_empty() && !logprobs {
            return None;
        }
        let toks = [(ev.id, ev.logprobs)];
        let choice = match r.parsed.endpoint {
            Endpoint::Chat => json!({
                "index": i, "delta": {"content": ev.text},
                "logprobs": if logprobs { r.chat_logprobs(&toks) } else { Value::Null }, "finish_reason": null,
            }),
            Endpoint::Completion => {
                let lp = if logprobs { r.completion_logprobs(&toks, self.offsets[i]) } else { Value::Null };
                self.offsets[i] += toks.iter().map(|(id, _)| r.token_text(*id).len()).sum::<usize>();
                json!({"index": i, "text": ev.text, "logprobs": lp, "finish_reason": null})
            }
        };
        Some(chunk(r, json!([choice])))
    }

    fn done(&mut self, i: usize, reason: FinishReason, usage: Counts) -> Option<Event> {
        self.done += 1;
        self.usage = self.usage.plus(usage);
        let r = &self.reply;
        let choice = match r.parsed.endpoint {
            Endpoint::Chat => json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": reason.openai_name()}),
            Endpoint::Completion => {
                json!({"index": i, "text": "", "logprobs": null, "finish_reason": reason.openai_name()})
            }
        };
        Some(chunk(r, json!([choice])))
    }
}

fn chunk(r: &Reply, choices: Value) -> Event {
    let object = if r.parsed.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
    Event::default().data(
        json!({"id": r.id, "object": object, "created": r.created, "model": r.model, "choices": choices}).to_string(),
    )
}

fn chunk_with(r: &Reply, choices: Value, usage: Value) -> Event {
    let object = if r.parsed.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
    Event::default().data(
        json!({"id": r.id, "object": object, "created": r.created, "model": r.model, "choices": choices, "usage": usage})
            .to_string(),
    )
}
