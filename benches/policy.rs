//! Cost of one access decision (`smithfs::policy::decide`) on the zones requests hit most: a smith in its
//! own `private/`, the operator, a parent writing a child's inbox, outside the smith dirs, and a denial
//! (which also words the reason). Issue 5 budgets identity + decision at < 2 µs per request on a cache hit.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use smithfs::identity::Identity;
use smithfs::policy::{
    decide, decide_all, Area, Ctx, Depth, Limits, NewKind, Op, OperatorMode, Removal, RootArea,
    SmithZone, Zone,
};
use smithfs::tree::model::{FullId, SmithIdx};

const ROOT: SmithIdx = SmithIdx(0);
const P: SmithIdx = SmithIdx(1);
const X: SmithIdx = SmithIdx(2);
const SIBLING: SmithIdx = SmithIdx(3);

fn names(s: SmithIdx) -> Option<FullId> {
    let full = match s.0 {
        0 => "smith-root",
        1 => "smith-root/smith-001",
        2 => "smith-root/smith-001/smith-002",
        3 => "smith-root/smith-001/smith-003",
        _ => return None,
    };
    FullId::parse(full)
}

/// A zone in X's smith dir (X is smith-002 at level 2, child of P).
fn x(area: Area, depth: Depth) -> Zone {
    Zone::Smith(SmithZone {
        owner: X,
        owner_parent: Some(P),
        owner_level: 2,
        area,
        depth,
    })
}

fn bench_decide(c: &mut Criterion) {
    let ctx = Ctx {
        operator: OperatorMode::ReadWrite,
        root: Some(ROOT),
        limits: Limits::default(),
        project: false,
        names: &names,
    };
    let private = x(Area::Private, Depth::Inner);
    let inbox = x(Area::Inbox, Depth::Inner);
    let templates = Zone::Outside {
        area: RootArea::Templates,
        depth: Depth::Inner,
    };
    let unlink = Op::Delete {
        how: Removal::Unlink,
        subtree_live: false,
    };
    let cases: [(&str, Identity, Op, Zone); 9] = [
        ("owner read private", Identity::Smith(X), Op::Read, private),
        (
            "owner write private",
            Identity::Smith(X),
            Op::Write,
            private,
        ),
        (
            "owner create file in private",
            Identity::Smith(X),
            Op::Create(NewKind::File),
            private,
        ),
        (
            "owner unlink in private",
            Identity::Smith(X),
            unlink,
            private,
        ),
        (
            "operator write private",
            Identity::Operator,
            Op::Write,
            private,
        ),
        (
            "parent create in child inbox",
            Identity::Smith(P),
            Op::Create(NewKind::File),
            inbox,
        ),
        (
            "smith read templates",
            Identity::Smith(X),
            Op::Read,
            templates,
        ),
        (
            "deny: sibling reads private",
            Identity::Smith(SIBLING),
            Op::Read,
            private,
        ),
        (
            "deny: unknown writes private",
            Identity::Unknown,
            Op::Write,
            private,
        ),
    ];
    let mut g = c.benchmark_group("policy/decide");
    for (name, id, op, zone) in cases {
        g.bench_function(name, |b| {
            b.iter(|| decide(black_box(&id), black_box(op), black_box(&zone), &ctx))
        });
    }
    g.finish();

    // A hard-linked inode with names in two areas of the same smith: the intersection of rights.
    let zones = [private, x(Area::Outbox, Depth::Inner)];
    c.bench_function("policy/decide_all/two zones, owner write", |b| {
        b.iter(|| {
            decide_all(
                black_box(&Identity::Smith(X)),
                Op::Write,
                black_box(&zones),
                &ctx,
            )
        })
    });
}

criterion_group!(benches, bench_decide);
criterion_main!(benches);
