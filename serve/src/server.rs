//! Binding, serving and graceful shutdown: SIGINT or SIGTERM stops accepting connections, lets
//! the requests in flight finish, then stops the engine.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use engine::{Engine, Error, Result};

use crate::router::router;

/// Serves `engine` on `listener` until `shutdown` completes, then drains and stops the engine.
pub async fn serve(
    engine: Engine,
    listener: TcpListener,
    body_limit: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let engine = Arc::new(engine);
    let app = router(Arc::clone(&engine), body_limit);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| Error::EngineStopped(format!("the HTTP server failed: {e}")))?;
    // Connections are closed; the engine (its last handle) stops here, joining the worker.
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
pub fn run(engine: Engine, addr: SocketAddr, body_limit: usize, on_listening: impl FnOnce(SocketAddr)) -> Result<()> {
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
        serve(engine, listener, body_limit, shutdown_signal()).await
    })
}
