//! The admin listener's bearer token (`server.admin_token_file`): read from its file on every
//! check, so that a new token written there takes effect without a restart, and compared in
//! constant time.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

#[derive(Debug, Clone)]
pub struct AdminToken {
    file: PathBuf,
}

/// Why a request was not let in.
#[derive(Debug, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer ...` header.
    Missing,
    /// A token, not the admin token.
    Wrong,
    /// The token file cannot be read, or is empty: nobody gets in.
    Unreadable(String),
}

impl AdminToken {
    /// Checks now that the file holds a token, so that a bad path fails the start.
    pub fn open(file: &Path) -> Result<Self, String> {
        let token = Self {
            file: file.to_owned(),
        };
        token.current()?;
        Ok(token)
    }

    fn current(&self) -> Result<String, String> {
        let text = std::fs::read_to_string(&self.file)
            .map_err(|e| format!("cannot read {}: {e}", self.file.display()))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(format!("{} holds no token", self.file.display()));
        }
        Ok(token.to_owned())
    }

    /// Whether an `Authorization` header value carries the admin token.
    pub fn check(&self, authorization: Option<&str>) -> Result<(), Denied> {
        let presented = authorization
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or(Denied::Missing)?;
        let expected = self.current().map_err(Denied::Unreadable)?;
        // Digests of equal length, compared without an early exit: the time taken says
        // nothing about how much of a guess was right, nor about the token's length.
        let (a, b) = (Sha256::digest(presented), Sha256::digest(expected));
        let difference = a.iter().zip(b.iter()).fold(0u8, |d, (x, y)| d | (x ^ y));
        if difference == 0 {
            Ok(())
        } else {
            Err(Denied::Wrong)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_in_the_file_lets_in_and_a_new_one_replaces_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("token");
        assert!(AdminToken::open(&file).is_err(), "no file");
        std::fs::write(&file, "  \n").expect("write");
        assert!(AdminToken::open(&file).is_err(), "an empty file");
        std::fs::write(&file, "s3cret\n").expect("write");
        let token = AdminToken::open(&file).expect("a token");
        assert_eq!(token.check(Some("Bearer s3cret")), Ok(()));
        assert_eq!(token.check(None), Err(Denied::Missing));
        assert_eq!(token.check(Some("s3cret")), Err(Denied::Missing));
        assert_eq!(token.check(Some("Bearer s3cre")), Err(Denied::Wrong));
        assert_eq!(token.check(Some("Bearer s3cret2")), Err(Denied::Wrong));
        std::fs::write(&file, "rotated").expect("write");
        assert_eq!(token.check(Some("Bearer s3cret")), Err(Denied::Wrong));
        assert_eq!(token.check(Some("Bearer rotated")), Ok(()));
        std::fs::remove_file(&file).expect("remove");
        assert!(matches!(
            token.check(Some("Bearer rotated")),
            Err(Denied::Unreadable(_))
        ));
    }
}
