//! Reports: the typed run report ([`schema`]) and what is made of it — the per-run
//! summary printed after `arfsnic run` ([`table`]), the seed-style steer-rate table with
//! CSV and markdown ([`results`]), its SVG charts ([`chart`]), the self-contained HTML page
//! with table, plots, per-flow view and settings ([`html`]), the plain-text block for a
//! patch email ([`email`]), KTAP and JUnit test cases for CI systems ([`cases`]), the merge of a matrix's shards
//! ([`merge`]) and the regression check
//! against a baseline ([`baseline`]). Everything here reads [`schema::Report`]; nothing
//! here imports the runner.

pub mod baseline;
pub mod cases;
pub mod chart;
pub mod email;
pub mod html;
pub mod merge;
pub mod results;
pub mod schema;
pub mod sweep;
pub mod table;

pub use schema::{Report, RunReport, SCHEMA_VERSION};
