//! The node's stop signal: a `watch` that turns true when the node starts shutting down.

use tokio::sync::watch;

/// Completes once the node starts shutting down; never, if the signal's sender is gone.
pub async fn until_stopping(stopping: &mut watch::Receiver<bool>) {
    if stopping.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}
