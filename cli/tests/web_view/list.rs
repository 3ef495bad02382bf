//! The list of sessions: titles, forks, reruns and sub-agents.

use super::*;

/// The list titles each session with its first message (as text), shows a
/// short prefix of its id that no other session shares, and marks a fork
/// with a link to its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_shows_titles_and_marks_forks() {
    let mut bed = Testbed::new()
        .replies(vec![
            MockReply::answer("Hello."),
            MockReply::answer("Again."),
        ])
        .daemon()
        .await;
    let original = bed.create().await;
    let (daemon, world) = (bed.take_daemon(), &bed.world);
    let said = "greet <b>ada</b>\u{202e} please";
    let (_, end) = daemon.message_and_wait(&original, said).await;
    assert_eq!(end["answer"], "Hello.", "{end}");
    let (status, forked) = daemon
        .post(&format!("/sessions/{original}/fork"), &json!({"at": 2}))
        .await;
    assert_eq!(status, 201, "{forked}");
    let fork = forked["session"].as_str().unwrap().to_string();
    let empty = daemon.create(&bed.agent_toml).await;

    let (browser, page) = signed_in_page(world, "ada", WAIT).await;
    let row = |id: &str| {
        blocking(|| {
            page.wait_for(
                &format!(
                    "(r => r && {{ title: r.querySelector('.session-link .title').innerText, \
                       link: r.querySelector('.session-link').getAttribute('href'), \
                       full: r.querySelector('.session-link').getAttribute('title'), \
                       short: r.querySelector('.short-id').innerText, \
                       marks: [...r.querySelectorAll('.mark')].map(m => [m.className, m.innerText, \
                         m.querySelector('a').getAttribute('href'), m.querySelector('a').getAttribute('title')]) }})\
                     (document.querySelector('#sessions tr[data-session=\"{id}\"]'))"
                ),
                WAIT,
            )
        })
    };
    let (a, f, e) = (row(&original), row(&fork), row(&empty));
    screenshot(&page, "14-sessions-titled");
    let escaped = "greet <b>ada</b>\\u{202e} please";
    assert_eq!(a["title"], escaped, "{a}");
    assert_eq!(f["title"], escaped, "the fork holds the same message: {f}");
    assert_eq!(e["title"], "no message yet", "{e}");
    let bold = blocking(|| page.eval("document.querySelectorAll('#sessions b').length"));
    assert_eq!(bold, 0, "the title is text, not markup");
    for (r, id) in [(&a, &original), (&f, &fork), (&e, &empty)] {
        assert_eq!(r["link"], format!("#/s/{id}"), "{r}");
        assert_eq!(r["full"], id.as_str(), "{r}");
        let short = r["short"].as_str().unwrap();
        assert!(short.len() >= 8 && id.starts_with(short), "{r}");
    }
    let shorts = [&a["short"], &f["short"], &e["short"]];
    assert!(
        shorts[0] != shorts[1] && shorts[1] != shorts[2] && shorts[0] != shorts[2],
        "{shorts:?}"
    );
    assert_eq!(a["marks"], json!([]), "{a}");
    assert_eq!(
        f["marks"],
        json!([[
            "mark fork",
            format!("fork of {}", a["short"].as_str().unwrap()),
            format!("#/s/{original}"),
            original
        ]]),
        "{f}"
    );
    // Found by its title's words.
    blocking(|| page.eval("location.hash = '#/?find=GREET'"));
    let found = blocking(|| {
        page.wait_for(
            "document.getElementById('find').value === 'GREET' && document.querySelectorAll('#sessions tbody tr').length",
            WAIT,
        )
    });
    assert_eq!(found, 2, "the session and its fork");
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}

/// A sub-agent's row in the list is marked with a link to its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_marks_a_sub_agent_with_its_parent() {
    let world = World::new();
    let parent_model = MockModel::start(
        vec![
            MockReply::calls(&[("billing", json!({ "message": "charge customer 1" }))]),
            MockReply::answer("The billing agent charged customer 1."),
        ],
        Fault::None,
    )
    .await;
    let child_model = MockModel::start(vec![MockReply::answer("Charged.")], Fault::None).await;
    std::fs::create_dir(world.dir.path().join("agents")).unwrap();
    let child = agent_toml(&child_model.base_url(), &[]).replace("test-agent", "billing");
    world.write("agents/billing.toml", &child);
    let billing = "name = \"billing\"\ndescription = \"The billing agent\"\nkind = \"agent\"\n\
                   agent = \"agents/billing.toml\"\neffect = \"side_effect\"\n";
    let agent = world.write(
        "parent.toml",
        &agent_toml(&parent_model.base_url(), &[billing.to_string()]),
    );
    let out = world
        .run(&["run", "--agent", agent.to_str().unwrap(), "bill customer 1"])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let parent = session_id(&out);
    let daemon = DaemonProcess::start(&world.data(), &[]).await;
    let (_, view) = daemon.get(&format!("/sessions/{parent}")).await;
    let child = view["children"][0]["session"]
        .as_str()
        .unwrap_or_else(|| panic!("no child: {view}"))
        .to_string();

    let (browser, page) = signed_in_page(&world, "ada", WAIT).await;
    let marks = |id: &str| {
        blocking(|| {
            page.wait_for(
                &format!(
                    "(r => r && [...r.querySelectorAll('.mark')].map(m => [m.className, m.innerText, \
                       m.querySelector('a').getAttribute('href'), m.querySelector('a').getAttribute('title')]))\
                     (document.querySelector('#sessions tr[data-session=\"{id}\"]'))"
                ),
                WAIT,
            )
        })
    };
    assert_eq!(marks(&parent), json!([]));
    let of_child = marks(&child);
    let text = of_child[0][1].as_str().unwrap();
    let short = text
        .strip_prefix("sub-agent of ")
        .unwrap_or_else(|| panic!("{of_child}"));
    assert!(short.len() >= 8 && parent.starts_with(short), "{of_child}");
    assert_eq!(of_child[0][0], "mark child", "{of_child}");
    assert_eq!(of_child[0][2], format!("#/s/{parent}"), "{of_child}");
    assert_eq!(of_child[0][3], parent.as_str(), "{of_child}");
    drop(page);
    drop(browser);
    assert!(daemon.terminate().await.success());
}
