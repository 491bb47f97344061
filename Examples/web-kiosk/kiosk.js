// The café kiosk's use of window.guidedAccess (the GuidedAccess page API).
//
// - "Accessibility" starts a session with invert-colors and zoom
//   (guidedAccess.startSession), and then turns them off and on again
//   (configureForSession); "Done" ends the visit (endSession), which gives
//   the screen back exactly as it was.
// - The page registers a restriction, "payment" ("Card payment"), that the
//   operator may deny during a session (guidedaccessctl restrict payment
//   deny); "Pay by card" is disabled while it is denied.
// - What the page shows comes from getState() and the sessionchange,
//   featureschange and restrictionchange events.
// - Without the service (the browser not started through
//   `guidedaccessctl browser`, or this origin not in [Browser]
//   AllowOrigins=) window.guidedAccess is undefined: the page works as a
//   plain order page and says that accessibility options are unavailable.
//   (When the browser is attached after the page loaded, the service loads
//   the page again, so guidedAccess is either there before this script
//   runs or not at all.)
'use strict';

(function () {
  const WANTED = ['invert-colors', 'zoom'];
  const RESTRICTION = { id: 'payment', text: 'Card payment', detailText: 'Paying by card at this kiosk' };
  const NAMES = {
    'invert-colors': 'inverted colours', zoom: 'zoom', grayscale: 'grayscale', 'high-contrast': 'high contrast',
    'large-text': 'large text', 'reduce-motion': 'reduced motion', 'screen-reader': 'screen reader',
    'on-screen-keyboard': 'on-screen keyboard',
  };

  const button = document.getElementById('accessibility');
  const end = document.getElementById('end');
  const status = document.getElementById('status');
  const payCard = document.getElementById('pay-card');
  const paymentNote = document.getElementById('payment-note');

  let api = null; // window.guidedAccess, once there
  let state = null; // the last getState(), kept up to date by the events
  let busy = false;

  function offered() {
    return state ? WANTED.filter((feature) => state.supportedFeatures.includes(feature)) : [];
  }

  function render() {
    if (!api) {
      button.disabled = true;
      button.setAttribute('aria-pressed', 'false');
      end.hidden = true;
      status.textContent = 'Accessibility options are not available on this kiosk.';
      return;
    }
    if (!state) {
      return; // 'checking…' until the first getState() answers
    }
    const features = offered();
    const on = state.sessionActive && features.length > 0 && features.every((f) => state.enabledFeatures.includes(f));
    button.disabled = busy || features.length === 0;
    button.setAttribute('aria-pressed', on ? 'true' : 'false');
    end.hidden = !state.sessionActive;
    if (features.length === 0) {
      status.textContent = 'Accessibility options are not available on this kiosk.';
    } else if (!state.sessionActive) {
      status.textContent = 'Accessibility: off. Press the button for inverted colours and zoom.';
    } else {
      const enabled = state.enabledFeatures.map((f) => NAMES[f] || f);
      let text = 'Accessibility: ' + (enabled.length ? enabled.join(', ') : 'off') + '.';
      if (state.sessionDeadline) {
        text += ' This visit ends at ' + new Date(state.sessionDeadline).toLocaleTimeString() + '.';
      }
      status.textContent = text;
    }
  }

  function say(what, error) {
    status.textContent = what + ': ' + (error && error.name ? error.name + ': ' + error.message : String(error));
  }

  function setPayment(restrictionState) {
    const denied = restrictionState === 'deny';
    payCard.disabled = denied;
    paymentNote.textContent = denied ? 'Card payment is not available right now. Please pay at the counter.' : '';
  }

  async function refresh() {
    try {
      state = await api.getState();
    } catch (error) {
      say('Accessibility options are unavailable', error);
      return;
    }
    render();
  }

  async function toggle() {
    if (!api || busy) {
      return;
    }
    busy = true;
    render();
    try {
      state = await api.getState();
      const features = offered();
      if (!state.sessionActive) {
        await api.startSession({ features });
      } else if (features.every((f) => state.enabledFeatures.includes(f))) {
        await api.configureForSession(features, false);
      } else {
        await api.configureForSession(features, true);
      }
      state = await api.getState();
    } catch (error) {
      busy = false;
      say('Could not change the accessibility options', error);
      return;
    }
    busy = false;
    render();
  }

  async function endVisit() {
    if (!api) {
      return;
    }
    try {
      await api.endSession();
    } catch (error) {
      say('Could not end the visit', error);
      return;
    }
    await refresh();
  }

  async function attach(guidedAccess) {
    if (api || !guidedAccess) {
      return;
    }
    api = guidedAccess;
    api.addEventListener('sessionchange', () => refresh());
    api.addEventListener('featureschange', (event) => {
      if (state) {
        state.enabledFeatures = event.detail.enabledFeatures;
        render();
      }
    });
    api.addEventListener('restrictionchange', (event) => {
      if (event.detail.id === RESTRICTION.id) {
        setPayment(event.detail.state);
      }
    });
    render();
    try {
      await api.registerRestrictions([RESTRICTION]);
      setPayment(await api.restrictionState(RESTRICTION.id));
    } catch (error) {
      // Card payment stays possible: the kiosk sells without the restriction.
      console.warn('GuidedAccess: cannot register the payment restriction:', error.name, error.message);
    }
    await refresh();
  }

  button.addEventListener('click', toggle);
  end.addEventListener('click', endVisit);
  payCard.addEventListener('click', () => { paymentNote.textContent = 'Insert or tap your card.'; });
  document.getElementById('pay-counter').addEventListener('click', () => {
    paymentNote.textContent = 'Please pay at the counter.';
  });

  // Defined before this script runs, or not at all.
  if (typeof window.guidedAccess !== 'undefined') {
    attach(window.guidedAccess);
  } else {
    render();
  }
})();
