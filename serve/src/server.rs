//! Binding, the accept loop and graceful shutdown: SIGINT or SIGTERM stops accepting
//! connections and lets the requests in flight finish for up to a grace period; connections
//! still open then are closed, and the engine stops. Each connection has its own timeouts
//! ([`crate::conn`]).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use engine::{Engine, Error, Result};

use crate::conn::{serve_connection, ConnTimeouts};
use crate::router::{router, RouterConfig};

/// How the server limits its clients.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The routes' body limits and API key.
    pub router: RouterConfig,
    /// Longest time to receive a request head.
    pub header_timeout: Duration,
    /// Longest time a keep-alive connection waits for its next request.
    pub idle_timeout: Duration,
    /// How long a shutdown waits for the requests in flight before closing their connections.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            router: RouterConfig::default(),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Serves `engine` on `listener` until `shutdown` completes, then drains (for up to
/// `cfg.shutdown_grace`) and stops the engine.
pub async fn serve(
    engine: Engine,
    listener: TcpListener,
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let engine = Arc::new(engine);
    let app = router(Arc::clone(&engine), cfg.router);
    let timeouts = ConnTimeouts { header: cfg.header_timeout, idle: cfg.idle_timeout };
    let graceful = GracefulShutdown::new();
    let mut conns = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    conns.spawn(serve_connection(stream, app.clone(), timeouts, graceful.watcher()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
        // Reap the finished connections so the set does not grow with every client.
        while conns.try_join_next().is_some() {}
    }
    drop(listener);
    if tokio::time::timeout(cfg.shutdown_grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(
            "{} connection(s) still open after the {} s grace period; closing them",
            conns.len(),
            cfg.shutdown_grace.as_secs_f64()
        );
    }
    // Aborting a connection drops its response stream, which cancels its job.
    conns.shutdown().await;
    drop(app);
    // The engine (its last handle) stops here, joining the worker.
    drop(engine);
    Ok(())
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down (finishing requests in flight)");
}

/// Binds `addr`, reports the address it listens on through `on_listening`, and serves until a
/// signal; blocks the calling thread (it runs its own tokio runtime).
pub fn run(engine: Engine, addr: SocketAddr, cfg: ServerConfig, on_listening: impl FnOnce(SocketAddr)) -> Result<()> {
    if cfg.router.api_key.is_none() && !addr.ip().is_loopback() {
        tracing::warn!("listening on {addr} without --api-key: anyone who can reach it can use the model");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::EngineStopped(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async move {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Settings { what: "address", detail: format!("cannot listen on {addr}: {e}") })?;
        let local = listener.local_addr().map_err(|e| Error::EngineStopped(e.to_string()))?;
        on_listening(local);
        serve(engine, listener, cfg, shutdown_signal()).await
    })
}
