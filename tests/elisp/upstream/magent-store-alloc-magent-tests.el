;;; magent-store-alloc-magent-tests.el --- What a chunk streamed by magent allocates  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The allocation bound of tests/elisp/magent-store-alloc-tests.el,
;; through magent's own code: a chunk appended by
;; `magent-thread-append-item-content' and the deferred save magent asks
;; for after it (as magent-agent.el's `record-text-delta' does), with
;; `magent-store-mode' on, against the same stream with persistence off.
;; magent and the shim are byte-compiled, as users load them.  Needs
;; MAGENT_LISP (see docs/DEVELOPING.md); `make test-magent' runs it.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test-upstream)
(require 'magent-store-test-alloc)
(require 'magent-store-redact)

(declare-function magent-thread-create "ext:magent-ledger" (&rest args))
(declare-function magent-thread-start-turn "ext:magent-ledger" (thread turn-id))
(declare-function magent-thread-start-item "ext:magent-ledger"
                  (thread turn-id type &rest args))
(declare-function magent-thread-append-item-content "ext:magent-ledger"
                  (thread item chunk &optional output-p))
(declare-function magent-thread-record-user-message-if-needed "ext:magent-ledger"
                  (thread turn-id content &optional phase metadata))
(declare-function magent-session-create "ext:magent-session" (&rest args))
(declare-function magent-session-save-deferred-for-session "ext:magent-session"
                  (session &optional scope delay))

(defun magent-store-alloc-magent-test--compile ()
  "Byte-compile magent's ledger and session functions in memory."
  (mapatoms (lambda (symbol)
              (when (and (fboundp symbol)
                         (string-match-p "\\`magent-\\(thread\\|session\\)"
                                         (symbol-name symbol))
                         (not (autoloadp (symbol-function symbol)))
                         (not (macrop symbol))
                         (not (byte-code-function-p (symbol-function symbol)))
                         (not (advice--p (symbol-function symbol))))
                (let ((byte-compile-warnings nil))
                  (ignore-errors (byte-compile symbol)))))))

(defun magent-store-alloc-magent-test--noop-save (_session &optional _scope _delay)
  "A deferred save that saves nothing (persistence off)."
  nil)

(defun magent-store-alloc-magent-test--sender (thread msession item)
  "Return a compiled function streaming a chunk into ITEM, as magent does.
It appends to ITEM of THREAD, then asks for MSESSION's deferred save."
  (byte-compile
   `(lambda (chunk)
      (magent-thread-append-item-content ',thread ',item chunk)
      (magent-session-save-deferred-for-session ',msession 'global))))

(defun magent-store-alloc-magent-test--run (redact)
  "Stream through magent with the mode on (REDACT: `magent-store-redact');
check it allocates at most 150 bytes a chunk more than with the mode off."
  (magent-store-test-upstream-load)
  (magent-store-test-alloc--with-backend
   (let ((magent-store-redact redact))
     (magent-store-alloc-magent-test--compile)
     (magent-store-test-alloc--compile)
     (let* ((magent-session-directory magent-store-root)
            (sid "s-alloc-magent")
            (thread (magent-thread-create :id sid :session-id sid))
            (msession (magent-session-create :id sid :thread thread))
            (n 396) (items nil) session with without)
       (magent-store-mode 1)
       (unwind-protect
           (progn
             (magent-thread-start-turn thread "turn-1")
             (magent-thread-record-user-message-if-needed
              thread "turn-1" "Refactor the store")
             ;; One item to warm up, one streamed with the mode on, one
             ;; without: the same stream into the same empty item.
             (dolist (id '("item-w" "item-a" "item-b"))
               (push (magent-thread-start-item thread "turn-1" 'message
                                               :id id :role 'assistant)
                     items))
             (setq items (nreverse items))
             (magent-store-flush sid)
             (setq session (gethash sid magent-store--sessions))
             (let ((magent-store-flush-interval 3600)
                   (chunks (magent-store-test-alloc--chunks n)))
               ;; A first stream fills the reused batch vectors.
               (magent-store-test-alloc--stream
		(magent-store-alloc-magent-test--sender thread msession (nth 0 items))
		(magent-store-test-alloc--chunks n) session)
               (let ((send (magent-store-alloc-magent-test--sender
                            thread msession (nth 1 items))))
                 (setq with (magent-store-test-alloc--counting
                             (magent-store-test-alloc--stream send chunks session))))
               (magent-store-mode -1)
               (let ((send (magent-store-alloc-magent-test--sender
                            thread msession (nth 2 items))))
                 (cl-letf (((symbol-function 'magent-session-save-deferred-for-session)
                            (byte-compile #'magent-store-alloc-magent-test--noop-save)))
                   (setq without (magent-store-test-alloc--counting
                                  (magent-store-test-alloc--stream send chunks nil))))))
             (let ((per-chunk (/ (float (magent-store-test-alloc--bytes
                                         (cl-mapcar #'- with without)))
                                 n)))
               (message "through magent%s: %.1f bytes per chunk (%S)"
			(if redact ", redaction on" "") per-chunk
			(cl-mapcar #'- with without))
               (should (<= per-chunk 150))
               ;; And the chunks are stored as magent has them.
               (magent-store-flush sid)
               (let* ((stored (magent-store-test-alloc--show sid))
                      (turn (aref (alist-get 'turns stored) 0)))
                 (should (equal (alist-get 'content
                                           (seq-find (lambda (item)
                                                       (equal (alist-get 'id item)
                                                              "item-a"))
                                                     (alist-get 'items turn)))
				(magent-thread-item-content (nth 1 items)))))))
         (magent-store-mode -1))))))

(ert-deftest magent-store-alloc-a-chunk-through-magent-costs-at-most-150-bytes ()
  "magent streaming a chunk with the mode on allocates at most 150 bytes more.
That is the advice's argument lists (magent's two calls per chunk), the
chunk's share of the ticks and replies, and nothing per chunk besides."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-alloc-magent-test--run nil))

(ert-deftest magent-store-alloc-redaction-adds-nothing-per-chunk-in-emacs ()
  "With `magent-store-redact' on, a chunk costs Emacs what it costs without:
the matching happens in the backend, and keeping a batch whose text the
backend holds back costs a cons per reply, nothing per chunk."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-alloc-magent-test--run t))

(provide 'magent-store-alloc-magent-tests)
;;; magent-store-alloc-magent-tests.el ends here
