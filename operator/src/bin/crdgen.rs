//! Prints the CustomResourceDefinitions of the Ursula operator as YAML; with `--write`,
//! writes one file per CRD into every directory of the repository that ships them
//! (`objects::CRD_DIRS`), or with `--out DIR` into DIR.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ursula_operator::objects::{CRD_DIRS, crd_files};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let dirs: Vec<PathBuf> = match args.get(1..).unwrap_or_default() {
        [] => {
            for (_, yaml) in crd_files() {
                print!("---\n{yaml}");
            }
            return ExitCode::SUCCESS;
        }
        [flag] if flag == "--write" => {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            CRD_DIRS.iter().map(|dir| root.join(dir)).collect()
        }
        [flag, dir] if flag == "--out" => vec![PathBuf::from(dir)],
        _ => {
            eprintln!("usage: crdgen [--write | --out DIR]");
            return ExitCode::from(2);
        }
    };
    for dir in dirs {
        for (file, yaml) in crd_files() {
            if let Err(error) = std::fs::write(dir.join(file), yaml) {
                eprintln!("crdgen: cannot write {}: {error}", dir.join(file).display());
                return ExitCode::FAILURE;
            }
        }
        println!("wrote the CRDs into {}", dir.display());
    }
    ExitCode::SUCCESS
}
