//! The listener: accepts clients, enforces maxclients, and on shutdown stops
//! accepting and waits for sessions to finish their in-flight replies.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::session::{self, Context};

/// How long shutdown waits for sessions to write their last replies.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn serve(listener: TcpListener, ctx: Arc<Context>, mut shutdown: watch::Receiver<bool>) {
    let active = Arc::new(AtomicUsize::new(0));
    let all_done = Arc::new(Notify::new());
    let maxclients = ctx.config.limits.maxclients;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.changed() => break,
            r = listener.accept() => r,
        };
        let (mut stream, _) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Usually out of file descriptors: wait for some to close.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if active.load(Ordering::Acquire) >= maxclients {
            crate::telemetry::clients().rejected.increment(1);
            tokio::spawn(async move {
                let _ = stream
                    .write_all(b"-ERR max number of clients reached\r\n")
                    .await;
            });
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (ctx, active, all_done) = (ctx.clone(), active.clone(), all_done.clone());
        tokio::spawn(async move {
            session::run(stream, ctx).await;
            if active.fetch_sub(1, Ordering::AcqRel) == 1 {
                all_done.notify_waiters();
            }
        });
    }
    drop(listener);
    tracing::info!(
        "shutting down: waiting for {} clients",
        active.load(Ordering::Acquire)
    );
    let drained = async {
        loop {
            let n = all_done.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if active.load(Ordering::Acquire) == 0 {
                return;
            }
            n.await;
        }
    };
    if tokio::time::timeout(DRAIN_TIMEOUT, drained).await.is_err() {
        tracing::warn!("shutdown: clients still busy after {DRAIN_TIMEOUT:?}, closing them");
    }
}
