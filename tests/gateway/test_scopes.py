from gateway import scopes as sc


def test_admin_satisfies_every_operator_scope():
    for scope in (sc.READ, sc.WRITE, sc.PAIRING, sc.APPROVALS, "operator.future"):
        assert sc.scope_satisfied([sc.ADMIN], scope)


def test_write_implies_read_but_not_pairing():
    assert sc.scope_satisfied([sc.WRITE], sc.READ)
    assert not sc.scope_satisfied([sc.WRITE], sc.PAIRING)
    assert not sc.scope_satisfied([sc.READ], sc.WRITE)


def test_unknown_scopes_need_an_exact_match():
    assert not sc.scope_satisfied([sc.WRITE], "operator.future")
    assert sc.scope_satisfied(["operator.future"], "operator.future")


def test_normalize_trims_and_deduplicates_in_order():
    assert sc.normalize_scopes([" operator.read", "operator.read", "", "operator.admin"]) == [sc.READ, sc.ADMIN]
