use http::{Response, StatusCode};

use crate::http::App;
use crate::http::error::ApiError;
use crate::http::response::{Body, Reply};
use crate::machine::{Command, Outcome};

/// `PUT /{bucket}`: 201 when new, 200 when it exists. The ID was validated by the router.
pub async fn create(app: &App, bucket: String) -> Result<Response<Body>, ApiError> {
    let outcome = app
        .engine(&bucket)?
        .clone()
        .propose(Command::CreateBucket { bucket })
        .await?;
    let created = matches!(outcome, Outcome::BucketCreated { created: true });
    Ok(Reply::new(if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    })
    .build())
}
