//! Prints the CustomResourceDefinitions of the Ursula operator as YAML, or with `--out DIR`
//! writes one file per CRD into DIR (the repository keeps them in `crds/`).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let out = match args.get(1..).unwrap_or_default() {
        [] => None,
        [flag, dir] if flag == "--out" => Some(PathBuf::from(dir)),
        _ => {
            eprintln!("usage: crdgen [--out DIR]");
            return ExitCode::from(2);
        }
    };
    for (file, yaml) in ursula_operator::objects::crd_files() {
        match &out {
            None => print!("---\n{yaml}"),
            Some(dir) => {
                if let Err(error) = std::fs::write(dir.join(file), yaml) {
                    eprintln!("crdgen: cannot write {file}: {error}");
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    ExitCode::SUCCESS
}
