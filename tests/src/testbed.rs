//! What most end-to-end tests start from, in one builder: a world (a data
//! directory, on sled or PostgreSQL), a scripted model, a side-effect sink,
//! an agent file on them, and, where a test needs them, a daemon and a
//! signed-in browser.
//!
//! ```ignore
//! let bed = Testbed::new()
//!     .replies(billing_replies())
//!     .sink_tools(|sink| billing_tools(sink).to_vec())
//!     .daemon()
//!     .await;
//! let id = bed.create().await;
//! let (_, end) = bed.daemon().message_and_wait(&id, "charge ada").await;
//! ```
//!
//! (Not the fault scenarios of [`crate::scenario`]: a testbed is where a
//! test begins, a scenario is what the crash matrix and the soak run.)

use crate::browser::{signed_in_page, Browser, Page};
use crate::daemon::DaemonProcess;
use crate::{agent_toml, Fault, MockModel, MockReply, Sink, World};
use std::future::{Future, IntoFuture};
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Output;
use std::time::Duration;

/// How long [`Testbed::signed_in`] waits for the web view's list.
const SIGN_IN_WAIT: Duration = Duration::from_secs(20);

/// A world with a model, a sink and an agent file (and a daemon, if asked
/// for), ready for a test. Built by [`Testbed::new`].
pub struct Testbed {
    /// The data directory (or store) and every file of the test.
    pub world: World,
    /// The scripted model the agent file points to (unless built with
    /// [`TestbedBuilder::model_url`]).
    pub model: MockModel,
    /// The side-effect sink, started for every testbed.
    pub sink: Sink,
    /// The agent file, `agent.toml` in the world's directory.
    pub agent: PathBuf,
    /// The agent file's text (what a daemon's `POST /sessions` takes).
    pub agent_toml: String,
    daemon: Option<DaemonProcess>,
}

/// The tools of an agent file, given the sink they may call.
type Tools = Box<dyn FnOnce(&Sink) -> Vec<String> + Send>;

/// What a [`Testbed`] is made of; `.await` it to start everything.
pub struct TestbedBuilder {
    world: Option<World>,
    replies: Vec<MockReply>,
    fault: Fault,
    tools: Vec<Tools>,
    model_url: Option<String>,
    model_options: String,
    agent_extra: String,
    daemon: Option<Vec<String>>,
}

impl Testbed {
    /// A testbed on a fresh sled world, with a model that has no replies,
    /// no tools, and no daemon; the builder's methods say otherwise.
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> TestbedBuilder {
        TestbedBuilder {
            world: None,
            replies: Vec::new(),
            fault: Fault::None,
            tools: Vec::new(),
            model_url: None,
            model_options: String::new(),
            agent_extra: String::new(),
            daemon: None,
        }
    }

    /// The daemon; panics if the testbed was built without one.
    pub fn daemon(&self) -> &DaemonProcess {
        self.daemon
            .as_ref()
            .expect("a daemon: build the testbed with .daemon()")
    }

    /// The daemon, taken out of the testbed (to kill or terminate it).
    pub fn take_daemon(&mut self) -> DaemonProcess {
        self.daemon
            .take()
            .expect("a daemon: build the testbed with .daemon()")
    }

    /// Starts a daemon on the world's data directory with `args` (after
    /// one was taken, say, to restart it).
    pub async fn start_daemon(&mut self, args: &[&str]) -> &DaemonProcess {
        assert!(self.daemon.is_none(), "a daemon runs already");
        let daemon = DaemonProcess::start(&self.world.data(), args).await;
        self.daemon.insert(daemon)
    }

    /// Creates a session of the agent file through the daemon; its id.
    pub async fn create(&self) -> String {
        self.daemon().create(&self.agent_toml).await
    }

    /// The agent file's path, as an argument.
    pub fn agent_arg(&self) -> &str {
        self.agent.to_str().unwrap()
    }

    /// Runs `mneme ARGS` on the world.
    pub async fn run(&self, args: &[&str]) -> Output {
        self.world.run(args).await
    }

    /// Runs `mneme run --agent AGENT MESSAGE` on the world.
    pub async fn run_agent(&self, message: &str) -> Output {
        self.run(&["run", "--agent", self.agent_arg(), message])
            .await
    }

    /// Runs `mneme run --agent AGENT MESSAGE`, SIGKILLed while the sink
    /// holds its call on `path` (applied, not yet answered); its output.
    pub async fn run_killed_in(&self, path: &str, message: &str) -> Output {
        let hold = self.sink.hold(path);
        let args = ["run", "--agent", self.agent_arg(), message];
        let mut child = self.world.spawn_until_applied(&args, hold.applied).await;
        child.start_kill().unwrap(); // SIGKILL
        let killed = child.wait_with_output().await.unwrap();
        assert!(!killed.status.success(), "killed in {path}");
        drop(hold.release);
        killed
    }

    /// A browser with a page signed in to the daemon as `name`, showing its
    /// sessions. Needs a multi-threaded runtime: the browser's steps block.
    pub async fn signed_in(&self, name: &str) -> (Browser, Page) {
        self.daemon();
        signed_in_page(&self.world, name, SIGN_IN_WAIT).await
    }
}

impl TestbedBuilder {
    /// On a fresh PostgreSQL store ([`World::on_postgres`]).
    pub fn on_postgres(self) -> TestbedBuilder {
        self.in_world(World::on_postgres())
    }

    /// In `world`, made by the test (to name its files in the tools).
    pub fn in_world(mut self, world: World) -> TestbedBuilder {
        self.world = Some(world);
        self
    }

    /// What the model answers, in order.
    pub fn replies(mut self, replies: Vec<MockReply>) -> TestbedBuilder {
        self.replies = replies;
        self
    }

    /// How the model misbehaves.
    pub fn fault(mut self, fault: Fault) -> TestbedBuilder {
        self.fault = fault;
        self
    }

    /// Tools of the agent file (TOML tables, as [`crate::command_tool`]
    /// makes them).
    pub fn tools(mut self, tools: impl IntoIterator<Item = String>) -> TestbedBuilder {
        let tools: Vec<String> = tools.into_iter().collect();
        self.tools.push(Box::new(move |_| tools));
        self
    }

    /// Tools of the agent file that call the sink (as
    /// [`crate::billing_tools`] makes them).
    pub fn sink_tools(
        mut self,
        tools: impl FnOnce(&Sink) -> Vec<String> + Send + 'static,
    ) -> TestbedBuilder {
        self.tools.push(Box::new(tools));
        self
    }

    /// The agent file's model is the server at `url` (a hostile one the
    /// test started, say), not the testbed's scripted model, which then
    /// goes unasked.
    pub fn model_url(mut self, url: &str) -> TestbedBuilder {
        self.model_url = Some(url.to_string());
        self
    }

    /// Lines for the agent file's `[model]` table (`context_window = 100`).
    pub fn model_options(mut self, lines: &str) -> TestbedBuilder {
        self.model_options.push_str(lines);
        self
    }

    /// TOML after the tools (`[limits]` and its lines, say).
    pub fn agent_extra(mut self, toml: &str) -> TestbedBuilder {
        self.agent_extra.push_str(toml);
        self
    }

    /// With a daemon on the world's data directory.
    pub fn daemon(self) -> TestbedBuilder {
        self.daemon_with(&[])
    }

    /// With a daemon on the world's data directory, given `args`.
    pub fn daemon_with(mut self, args: &[&str]) -> TestbedBuilder {
        self.daemon = Some(args.iter().map(|a| a.to_string()).collect());
        self
    }

    async fn start(self) -> Testbed {
        let world = self.world.unwrap_or_default();
        let model = MockModel::start(self.replies, self.fault).await;
        let sink = Sink::start().await.unwrap();
        let tools: Vec<String> = self.tools.into_iter().flat_map(|t| t(&sink)).collect();
        let url = self.model_url.unwrap_or_else(|| model.base_url());
        let mut text = agent_toml(&url, &[]);
        text.push_str(&self.model_options);
        for tool in &tools {
            text.push_str("[[tools]]\n");
            text.push_str(tool);
        }
        text.push_str(&self.agent_extra);
        let agent = world.write("agent.toml", &text);
        let daemon = match self.daemon {
            Some(args) => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Some(DaemonProcess::start(&world.data(), &args).await)
            }
            None => None,
        };
        Testbed {
            world,
            model,
            sink,
            agent,
            agent_toml: text,
            daemon,
        }
    }
}

impl IntoFuture for TestbedBuilder {
    type Output = Testbed;
    type IntoFuture = Pin<Box<dyn Future<Output = Testbed> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.start())
    }
}
