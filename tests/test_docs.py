"""The reference pages under docs/ are generated from the code, or checked against it."""
from conjugate.plan import reference
from conjugate.plan.schema import PLAN


def test_the_plan_reference_is_generated_from_the_declaration_and_current():
    assert reference.main(["--check"]) == 0


def test_the_plan_reference_names_every_field_of_the_declaration():
    text = reference.DOC_FILE.read_text()
    for key in [*PLAN.fields["draft"].fields, *PLAN.fields["cross"].fields]:
        assert f".{key}" in text, key


def test_a_changed_declaration_shows_as_out_of_date(monkeypatch, tmp_path):
    page = tmp_path / "plans.md"
    page.write_text(reference.DOC_FILE.read_text().replace("Later ones win.", "Earlier ones win."))
    monkeypatch.setattr(reference, "DOC_FILE", page)
    assert reference.main(["--check"]) == 1
    assert reference.main([]) == 0 and reference.main(["--check"]) == 0


def test_the_cli_reference_has_every_command_and_option_of_the_parser():
    from conjugate.cli import reference
    from conjugate.cli.main import build_parser

    text = reference.DOC_FILE.read_text()
    commands = list(reference._subcommands(build_parser()))
    assert {"search", "plan upgrade", "generate", "export"} <= {name for name, _ in commands}
    for name, sub in commands:
        assert f"## `conjugate {name}`" in text, name
        for action in sub._actions:
            for option in action.option_strings:
                assert option in text.split(f"## `conjugate {name}`")[1].split("\n## ")[0], (name, option)
