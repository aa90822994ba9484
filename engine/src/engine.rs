//! The engine: one worker thread owns the target (MLX arrays are not `Sync`, so they stay on
//! the thread that made them) and a pool of drafters, one per concurrent session (forks sharing
//! one drafter's weights). Requests arrive through a channel and are admitted in arrival order
//! while fewer than `max_concurrency` sessions are active; every iteration then steps all
//! active sessions together ([`crate::batch`]: their drafts, one target forward over all their
//! rows, each session's verdict), so new requests join and finished ones leave between
//! iterations. Each session's output goes back through its own [`Events`] channel (the server's is
//! an async one; this crate names none, so the CLI links no async runtime); a session whose
//! receiver is gone (the client disconnected) is dropped before its next round.
//!
//! Every request's start and every round run under `catch_unwind`: a failure, even a panic,
//! ends that request with an error event and the worker goes on.
//!
//! The worker logs each request's end through `tracing` (the server's binary prints it), with
//! the request's label in the `request` field.
//!

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use gemma4::chat_template::ChatTemplate;
use gemma4::tokenizer::{stop_tokens, Tokenizer};
use gemma4::{ComputeDtype, Model, TapSet, TextConfig};
use spec_decode::{Drafter, Pruning};

use crate::batch::{self, BatchSchedule, Member};
use crate::error::{Error, Result};
use crate::prompt_cache::PromptCache;
use crate::schedule::{choose, Schedule};
use crate::session::{Outcome, Request, Session, StepOut};
use crate::starting::Starting;
use spec_decode::schedule::batch::BatchCost;

/// How the engine is set up.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The target checkpoint directory.
    pub model_dir: PathBuf,
    /// The model id clients name (`model` in requests, `/v1/models`).
    pub model_id: String,
    /// A drafter checkpoint directory: speculative decoding; `None`: plain decoding.
    pub drafter_dir: Option<PathBuf>,
    /// Sessions decoded at once (each speculative one holds its own drafter).
    pub max_concurrency: usize,
    /// Prefill chunk size, the grid prompts are prefilled on (one chunk per iteration while
    /// other sessions decode) and the prompt cache reuses prefixes on; `None`: chosen at load
    /// ([`auto_prefill_step`]).
    pub prefill_step: Option<usize>,
    /// Prefix states the prompt cache keeps (0 turns it off).
    pub prompt_cache: usize,
    /// Drafts per round (`None`: the drafter's block size).
    pub gamma: Option<usize>,
    /// The compute dtype the model is loaded in (see `gemma4::compute`).
    pub dtype: ComputeDtype,
    /// Verify windows by the throughput schedule for requests of a mode (greedy or sampled)
    /// the drafter is calibrated for, when the model has a verify-cost profile for this device
    /// and dtype (`dspark calibrate`, `dspark profile`); full blocks otherwise.
    pub throughput_schedule: bool,
    /// Tests only: a request whose prompt holds this token panics in the worker, to show that
    /// an internal failure answers 500 and the worker goes on.
    #[cfg(feature = "testing")]
    pub panic_on_token: Option<u32>,
}

impl EngineConfig {
    /// Defaults for `model_dir`: plain decoding, 4 sessions, prefill chunks chosen at load, a
    /// prompt cache of 8 states, the checkpoint's own dtype.
    pub fn new(model_dir: PathBuf, model_id: String) -> EngineConfig {
        EngineConfig {
            model_dir,
            model_id,
            drafter_dir: None,
            max_concurrency: 4,
            prefill_step: None,
            prompt_cache: 8,
            gamma: None,
            dtype: ComputeDtype::Stored,
            throughput_schedule: true,
            #[cfg(feature = "testing")]
            panic_on_token: None,
        }
    }
}

/// What the HTTP side needs to know about the served model, read without MLX.
#[derive(Debug)]
pub struct ModelInfo {
    /// The model id clients name ([`EngineConfig::model_id`]): a request's `model` must match
    /// it, and `/v1/models` lists it.
    pub id: String,
    /// Positions the model was trained for: prompt plus completion must fit.
    pub context: usize,
    /// Vocabulary size in tokens: token-id prompts and `top_k` are checked against it.
    pub vocab: usize,
    /// Tokens that end generation (not emitted).
    pub stop_tokens: Vec<u32>,
    /// The checkpoint's tokenizer (`tokenizer.json`); `None`: prompts must be token ids, the
    /// output text is empty, and stop strings and chat are refused.
    pub tokenizer: Option<Tokenizer>,
    /// The tokenizer's chat template; `None`: chat messages are joined by newlines (see
    /// [`crate::chat`]).
    pub template: Option<ChatTemplate>,
    /// Whether a drafter was given, so requests decode speculatively.
    pub speculative: bool,
    /// Prefill chunk size in tokens (at least 1), copied into each request: set once the
    /// model is loaded ([`Self::prefill_step`]).
    pub prefill_step: std::sync::OnceLock<usize>,
    /// Drafts per round copied into each request (`None`: the drafter's block size).
    pub gamma: Option<usize>,
}

impl ModelInfo {
    /// Prefill chunk size in tokens, copied into each request (2048 before the engine loaded).
    pub fn prefill_step(&self) -> usize {
        self.prefill_step.get().copied().unwrap_or(2048)
    }
}

/// The prefill grid for an engine: the largest chunk (a power of two from 32 to 2048 tokens)
/// whose forward costs at most two decode steps, measured on this model (after 64 tokens of
/// context, best of three): a request prefilling between decode iterations then at most
/// triples the gap between the tokens of the sessions already running.
pub fn auto_prefill_step(model: &Model) -> Result<usize> {
    let vocab = model.config().vocab_size as u32;
    let ids = |n: usize| -> Result<mlx_core::Array> {
        let v: Vec<u32> = (0..n as u32).map(|i| 4 + (i * 7919) % (vocab.max(5) - 4)).collect();
        Ok(gemma4::generate::ids_array(&v)?)
    };
    let context = model.new_cache();
    let mut context = context;
    model.forward(&ids(64)?, Some(&mut context))?;
    context.eval()?;
    let time = |n: usize| -> Result<f64> {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let mut c = context.clone();
            let t = Instant::now();
            model.forward(&ids(n)?, Some(&mut c))?.eval()?;
            c.eval()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let step = time(1)?;
    let mut chosen = 32;
    let mut n = 32;
    while n <= 2048 && n + 64 <= model.config().max_position_embeddings {
        if time(n)? > 2.0 * step {
            break;
        }
        chosen = n;
        n *= 2;
    }
    Ok(chosen)
}

/// What a session sends back.
#[derive(Debug)]
pub enum Event {
    /// One round's output.
    Step(StepOut),
    /// The session ended; the last event.
    Done(Box<Outcome>),
    /// The request failed (a message for the client); the last event.
    Failed(String),
}

/// Where a job's events go: the sending half of a channel whose receiver is the client.
pub trait Events: Send {
    /// Sends one event; an event for a receiver that is gone is dropped.
    fn send(&self, event: Event);
    /// Whether the receiver is gone: the engine then cancels the job.
    fn is_closed(&self) -> bool;
}

/// A request for the worker.
pub struct Job {
    /// What to decode: the prompt's ids and the generation settings.
    pub request: Request,
    /// Where the events go; dropping their receiver cancels the request.
    pub events: Box<dyn Events>,
    /// Names the request in the log.
    pub label: String,
}

/// Request counts, for `/health` and for checking that nothing leaks.
#[derive(Debug, Default)]
pub struct Counters {
    /// Submitted, not yet admitted.
    pub queued: AtomicUsize,
    /// Sessions decoding now.
    pub active: AtomicUsize,
    /// Decoded to a finish reason (stop or length) and sent their [`Event::Done`].
    pub completed: AtomicUsize,
    /// Ended because the client went away (queued or active).
    pub cancelled: AtomicUsize,
    /// Ended with an [`Event::Failed`]: an error or a caught panic at start or in a round.
    pub failed: AtomicUsize,
}

/// The request counts at one moment (`/health`'s `requests`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RequestCounts {
    /// Submitted, not yet admitted (`queued`).
    pub queued: usize,
    /// Sessions decoding now (`active`).
    pub active: usize,
    /// Ended normally since the engine started (`completed`).
    pub completed: usize,
    /// Ended because the client went away, since the engine started (`cancelled`).
    pub cancelled: usize,
    /// Ended with an error since the engine started (`failed`).
    pub failed: usize,
}

impl Counters {
    /// The counts now.
    pub fn snapshot(&self) -> RequestCounts {
        let g = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        RequestCounts {
            queued: g(&self.queued),
            active: g(&self.active),
            completed: g(&self.completed),
            cancelled: g(&self.cancelled),
            failed: g(&self.failed),
        }
    }
}

fn inc(c: &AtomicUsize) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn dec(c: &AtomicUsize) {
    c.fetch_sub(1, Ordering::Relaxed);
}

/// A running engine (see the module docs).
pub struct Engine {
    tx: Option<Sender<Job>>,
    info: Arc<ModelInfo>,
    counters: Arc<Counters>,
    worker: Option<JoinHandle<()>>,
}

impl Engine {
    /// Reads the config and tokenizer, then loads the target and `max_concurrency` drafters on
    /// the worker thread; returns once they are loaded (or with the load error).
    pub fn start(cfg: EngineConfig) -> Result<Engine> {
        if cfg.max_concurrency == 0 {
            return Err(Error::Settings { what: "max_concurrency", detail: "must be at least 1".into() });
        }
        let load_err = |detail: String| Error::Load { path: cfg.model_dir.clone(), detail };
        let text_cfg = TextConfig::from_dir(&cfg.model_dir).map_err(|e| load_err(e.to_string()))?;
        let tokenizer = if cfg.model_dir.join("tokenizer.json").is_file() {
            Some(Tokenizer::from_dir(&cfg.model_dir)?)
        } else {
            None
        };
        let template = match &tokenizer {
            Some(t) => ChatTemplate::of(t)?,
            None => None,
        };
        let info = Arc::new(ModelInfo {
            id: cfg.model_id.clone(),
            context: text_cfg.max_position_embeddings,
            vocab: text_cfg.vocab_size,
            stop_tokens: stop_tokens(&text_cfg, tokenizer.as_ref()),
            tokenizer,
            template,
            speculative: cfg.drafter_dir.is_some(),
            prefill_step: std::sync::OnceLock::new(),
            gamma: cfg.gamma,
        });
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<()>>(1);
        let winfo = Arc::clone(&info);
        let counters = Arc::new(Counters::default());
        let wcounters = Arc::clone(&counters);
        let worker = std::thread::Builder::new()
            .name("dspark-engine".into())
            .spawn(move || worker(cfg, winfo, wcounters, rx, ready_tx))
            .map_err(|e| Error::EngineStopped(format!("cannot start the worker thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Engine { tx: Some(tx), info, counters, worker: Some(worker) }),
            Ok(Err(e)) => {
                let _ = worker.join();
                Err(e)
            }
            Err(_) => {
                let _ = worker.join();
                Err(Error::EngineStopped("the worker ended while loading".into()))
            }
        }
    }

    /// The served model.
    pub fn info(&self) -> &Arc<ModelInfo> {
        &self.info
    }

    /// The request counts.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Queues a request.
    pub fn submit(&self, job: Job) -> Result<()> {
        let tx = self.tx.as_ref().ok_or_else(|| Error::EngineStopped("shut down".into()))?;
        inc(&self.counters.queued);
        tx.send(job).map_err(|_| {
            dec(&self.counters.queued);
            Error::EngineStopped("the worker has stopped".into())
        })
    }

    /// Stops taking requests, lets the active and queued ones finish, and joins the worker.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.tx = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An admitted request whose prompt is being prefilled.
struct Admitting<'t> {
    job: Job,
    starting: Starting<'t>,
    slot: usize,
    t0: Instant,
}

/// An admitted request.
struct Active<'m, 't> {
    job: Job,
    session: Session<'m, 't>,
    slot: usize,
    t0: Instant,
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Runs `f`, turning a panic into an error.
fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(Error::Panicked(panic_message(p))))
}

/// Throughput-schedule plans for greedy and for sampled requests, where calibrated and profiled.
type Plans = [Option<spec_decode::ThroughputPlan>; 2];

fn plans(cfg: &EngineConfig, model: &Model, drafter: Option<&dyn Drafter>, device: mlx_core::Device) -> Result<Plans> {
    let mut plans: Plans = [None, None];
    let Some(d) = drafter else { return Ok(plans) };
    let schedule = if cfg.throughput_schedule { Schedule::Auto } else { Schedule::Full };
    for (slot, greedy) in plans.iter_mut().zip([true, false]) {
        let (pruning, line) = choose(schedule, None, d, model, &cfg.model_dir, device, greedy)?;
        if let Pruning::Throughput(plan) = pruning {
            *slot = Some(plan);
        }
        tracing::info!("{} requests: {line}", if greedy { "greedy" } else { "sampled" });
    }
    Ok(plans)
}

/// The request as decoded: one that asks for no pruning gets the engine's schedule for its mode.
fn scheduled(req: &Request, plans: &Plans, auto: bool) -> Request {
    let plan = &plans[usize::from(!req.generate.sampler.is_greedy())];
    match (&req.pruning, plan) {
        (Pruning::Off, Some(p)) => Request { pruning: Pruning::Throughput(p.clone()), adaptive: auto, ..req.clone() },
        (Pruning::Off, None) => Request { adaptive: auto, ..req.clone() },
        _ => req.clone(),
    }
}

/// What the worker serves with: the target, one drafter per session slot, the schedules.
struct Loaded {
    model: Model,
    drafters: Vec<Box<dyn Drafter>>,
    plans: Plans,
    batch_cost: Option<BatchCost>,
}

/// The cost curve of batched forwards for the batch schedule: the profile's batch curve, or its
/// per-window verify costs (rows from one session cost about what rows from several do), when
/// some mode runs the throughput schedule.
fn batch_cost(cfg: &EngineConfig, model: &Model, plans: &Plans, device: mlx_core::Device) -> Result<Option<BatchCost>> {
    if plans.iter().all(Option::is_none) {
        return Ok(None);
    }
    let key = spec_decode::profile::profile_key(device, model);
    let Some(p) = spec_decode::profile::load(&cfg.model_dir, &key)? else { return Ok(None) };
    let curve = match &p.batch {
        Some(points) => BatchCost::new(points.clone()),
        None => BatchCost::from_table(&p.cost),
    };
    match &curve {
        Some(_) => tracing::info!(
            "batch schedule: windows chosen across requests, priced by {}",
            if p.batch.is_some() { "the profile's batch curve" } else { "the profile's verify costs" }
        ),
        None => tracing::warn!("the profile for {key} has no usable cost curve; sessions keep their own windows"),
    }
    Ok(curve)
}

fn load(cfg: &EngineConfig) -> Result<Loaded> {
    let load_err = |e: gemma4::Error| Error::Load { path: cfg.model_dir.clone(), detail: e.to_string() };
    let device = mlx_core::Device::default_device().map_err(|e| load_err(e.into()))?;
    let (model, resolved) = Model::load_as(&cfg.model_dir, cfg.dtype, device).map_err(load_err)?;
    let mut drafters = Vec::new();
    if let Some(dir) = &cfg.drafter_dir {
        // One loaded drafter; the other sessions' are forks sharing its weights (each with
        // its own context), which is also what lets their drafts run as one batched forward.
        let load = || {
            spec_decode::load_drafter_as(dir, model.config(), resolved.conversion.dequantize)
                .map_err(|e| Error::Load { path: dir.clone(), detail: e.to_string() })
        };
        let first = load()?;
        for _ in 1..cfg.max_concurrency {
            drafters.push(match first.fork() {
                Some(d) => d,
                None => load()?,
            });
        }
        drafters.insert(0, first);
        // Refuse a bad gamma now rather than on every request.
        spec_decode::SpecConfig { gamma: cfg.gamma, ..Default::default() }.gamma_for(drafters[0].as_ref())?;
    }
    let plans = plans(cfg, &model, drafters.first().map(|d| d.as_ref()), device)?;
    let batch_cost = batch_cost(cfg, &model, &plans, device)?;
    Ok(Loaded { model, drafters, plans, batch_cost })
}

/// Ends an admitted request with an error: logged, counted, sent, its slot freed.
fn failed(n: &Counters, job: &Job, e: &Error, slot: usize, free: &mut Vec<usize>) {
    tracing::warn!(request = %job.label, "failed: {e}");
    dec(&n.active);
    inc(&n.failed);
    job.events.send(Event::Failed(e.to_string()));
    free.push(slot);
}

fn log_done(label: &str, o: &Outcome, wall_ms: f64) {
    let tau = o.speculation.as_ref().map_or_else(|| "-".to_string(), |s| format!("{:.2}", s.tau()));
    tracing::info!(
        request = %label,
        "prompt {} tokens ({} cached) | completion {} tokens | {:.1} tok/s | τ {tau} | finish {} | {:.0} ms",
        o.prompt_tokens,
        o.cached_tokens,
        o.tokens.len(),
        o.tok_per_s(),
        o.finish.as_str(),
        wall_ms
    );
}

fn worker(
    cfg: EngineConfig,
    info: Arc<ModelInfo>,
    n: Arc<Counters>,
    rx: Receiver<Job>,
    ready: mpsc::SyncSender<Result<()>>,
) {
    let loaded = guarded(|| {
        let l = load(&cfg)?;
        let step = match cfg.prefill_step {
            Some(s) => s.max(1),
            None => {
                let s = auto_prefill_step(&l.model)?;
                tracing::info!(
                    "prefill chunks of {s} tokens (a chunk costs at most two decode steps; --prefill-step sets it)"
                );
                s
            }
        };
        let _ = info.prefill_step.set(step);
        Ok(l)
    });
    let Loaded { model, mut drafters, plans, batch_cost } = match loaded {
        Ok(m) => {
            let _ = ready.send(Ok(()));
            m
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    drop(ready);
    let model = &model;
    let tok = info.tokenizer.as_ref();
    let mut cache = PromptCache::new(cfg.prompt_cache);
    let mut active: Vec<Active<'_, '_>> = Vec::new();
    let mut starting: std::collections::VecDeque<Admitting<'_>> = std::collections::VecDeque::new();
    let mut schedule = BatchSchedule::new(batch_cost);
    // The last batched step's wall time: the prefill done between steps is bounded by it.
    let mut last_step_ms = 0.0f64;
    // Drafter slots not in use (a plain engine has no drafters; its sessions use slot 0).
    let mut free: Vec<usize> = (0..cfg.max_concurrency).rev().collect();
    loop {
        // Admit in arrival order; block only when nothing is running or starting.
        while !free.is_empty() {
            let job = if active.is_empty() && starting.is_empty() {
                match rx.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            } else {
                match rx.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                }
            };
            dec(&n.queued);
            if job.events.is_closed() {
                tracing::info!(request = %job.label, "cancelled while queued");
                inc(&n.cancelled);
                continue;
            }
            let Some(slot) = free.pop() else {
                job.events.send(Event::Failed("no free session slot".into()));
                inc(&n.failed);
                break;
            };
            let t0 = Instant::now();
            let taps = drafters.get(slot).map_or_else(|| TapSet::new([]), |d| d.taps());
            match guarded(|| {
                #[cfg(feature = "testing")]
                if cfg.panic_on_token.is_some_and(|t| job.request.prompt.contains(&t)) {
                    panic!("injected fault (testing)");
                }
                Starting::new(
                    model,
                    taps,
                    &scheduled(&job.request, &plans, cfg.throughput_schedule),
                    tok,
                    Some(&mut cache),
                )
            }) {
                Ok(s) => {
                    inc(&n.active);
                    starting.push_back(Admitting { job, starting: s, slot, t0 });
                }
                Err(e) => {
                    tracing::warn!(request = %job.label, "failed: {e}");
                    inc(&n.failed);
                    job.events.send(Event::Failed(e.to_string()));
                    free.push(slot);
                }
            }
        }
        // Prefill in chunks of the prefill grid while sessions decode, for about two of their
        // steps' time per iteration (at least one chunk), so a long prompt delays their next
        // token by a bounded time rather than by its whole prefill; everything at once when
        // none decodes.
        let t_prefill = Instant::now();
        while let Some(mut a) = starting.pop_front() {
            if a.job.events.is_closed() {
                tracing::info!(request = %a.job.label, "cancelled while prefilling");
                dec(&n.active);
                inc(&n.cancelled);
                free.push(a.slot);
                continue;
            }
            let result = guarded(|| {
                let done = a.starting.advance(model)?;
                Ok(done || active.is_empty())
            });
            match result {
                Ok(true) => {
                    let Admitting { job, starting: s, slot, t0 } = a;
                    let drafter = drafters.get_mut(slot).map(|d| d.as_mut());
                    match guarded(|| s.finish(model, drafter, Some(&mut cache))) {
                        Ok(session) => active.push(Active { job, session, slot, t0 }),
                        Err(e) => failed(&n, &job, &e, slot, &mut free),
                    }
                }
                Ok(false) => starting.push_front(a),
                Err(e) => failed(&n, &a.job, &e, a.slot, &mut free),
            }
            if !active.is_empty() && t_prefill.elapsed().as_secs_f64() * 1e3 >= 2.0 * last_step_ms {
                break;
            }
        }
        // Cancelled sessions leave before the step.
        let mut i = 0;
        while i < active.len() {
            if active[i].job.events.is_closed() {
                let a = active.remove(i);
                let o = a.session.finish();
                tracing::info!(request = %a.job.label, "cancelled by the client after {} tokens", o.tokens.len());
                dec(&n.active);
                inc(&n.cancelled);
                free.push(a.slot);
                continue;
            }
            i += 1;
        }
        if active.is_empty() {
            continue;
        }
        // One batched step of every active session.
        let outs = {
            let mut lent: Vec<Option<&mut Box<dyn Drafter>>> = Vec::new();
            let mut pool: Vec<Option<&mut Box<dyn Drafter>>> = drafters.iter_mut().map(Some).collect();
            for a in &active {
                lent.push(pool.get_mut(a.slot).and_then(Option::take));
            }
            let mut members: Vec<Member<'_, '_, '_>> = active
                .iter_mut()
                .zip(lent)
                .map(|(a, d)| Member { session: &mut a.session, drafter: d.map(|d| d.as_mut()) })
                .collect();
            let count = members.len();
            let t_step = Instant::now();
            let outs = catch_unwind(AssertUnwindSafe(|| batch::step(model, &mut members, &mut schedule)));
            last_step_ms = t_step.elapsed().as_secs_f64() * 1e3;
            match outs {
                Ok(outs) => outs,
                Err(p) => {
                    let msg = panic_message(p);
                    (0..count).map(|_| Err(Error::Panicked(msg.clone()))).collect()
                }
            }
        };
        // Deliver, and let finished or failed sessions leave at once.
        let mut kept = Vec::with_capacity(active.len());
        for (a, out) in active.drain(..).zip(outs) {
            match out {
                Ok(out) => {
                    let done = out.finished.is_some();
                    if !out.tokens.is_empty() || !out.text.is_empty() {
                        a.job.events.send(Event::Step(out));
                    }
                    if done {
                        let o = a.session.finish();
                        log_done(&a.job.label, &o, a.t0.elapsed().as_secs_f64() * 1e3);
                        dec(&n.active);
                        inc(&n.completed);
                        a.job.events.send(Event::Done(Box::new(o)));
                        free.push(a.slot);
                    } else {
                        kept.push(a);
                    }
                }
                Err(e) => failed(&n, &a.job, &e, a.slot, &mut free),
            }
        }
        active = kept;
    }
}
