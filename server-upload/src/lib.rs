//! Pushing profiles to Pyroscope (`/push.v1.PusherService/Push`, Connect protocol, protobuf), with
//! what an agent on every node needs: a queue bounded in bytes between profiling and upload,
//! retries with backoff and jitter, a clear report of authentication failures, a deadline on
//! shutdown, and a spool directory so that a restart loses nothing.

mod proto;
mod queue;
mod spool;
mod uploader;

pub use proto::{LabelPair, PushRequest, RawProfileSeries, RawSample};
pub use queue::{DropReason, Next, PushItem, Queue, QueueStats};
pub use spool::{prepare_spool_dir, SpoolError};
pub use uploader::{redact_url, Auth, PushConfig, Secret, Uploader, UploadError};
