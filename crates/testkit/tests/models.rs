//! The kit looks for the real models where `minfer pull` puts them, under the same names.

use minfer_testkit::models;

#[test]
fn models_dir_is_the_one_minfer_pull_fills() {
    assert_eq!(models::dir(), minfer_hub::models_dir());
}

#[test]
fn known_models_are_in_the_registry() {
    for (name, file) in models::KNOWN {
        let m = minfer_hub::find(name).unwrap_or_else(|| panic!("{name} not in minfer_hub::KNOWN"));
        assert_eq!(m.file, file, "{name}");
    }
    assert_eq!(models::KNOWN[0].1, models::QWEN);
    assert_eq!(models::KNOWN[1].1, models::SMOL);
}
