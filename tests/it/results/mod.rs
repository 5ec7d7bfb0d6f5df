//! A run's results folder: the committed reference, the files' contract, the streaming writers,
//! the report pages, and results folders read back as hostile input.

mod contract;
mod hostile;
mod reference;
mod report_html;
mod report_lines;
mod report_verdict;
mod streaming;
