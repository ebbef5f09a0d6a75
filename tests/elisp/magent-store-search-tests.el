;;; magent-store-search-tests.el --- ERT tests for M-x magent-store-search  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; Sessions are written through the shim to a real backend (which indexes
;; them as it flushes), then searched with the real `magent-store search'
;; process, as a user's Emacs does.  magent is not loaded here, so RET shows
;; the read-only transcript, or hands the session to the functions on
;; `magent-store-search-resume-functions'; RET into magent's own loader is
;; tested against upstream magent in upstream/magent-store-search-magent-tests.el.

;;; Code:

(require 'ert)
(require 'magent-store-test)
(require 'magent-store-search)

(defun magent-store-search-test--write (session-id chunks)
  "Write a session SESSION-ID whose assistant reply streams CHUNKS."
  (magent-store-open session-id)
  (magent-store-test--start-turn session-id)
  (dolist (chunk chunks)
    (magent-store-append-item-content session-id "item-1" chunk))
  (magent-store-flush session-id))

(defun magent-store-search-test--wait (buffer)
  "Wait until the search of BUFFER has drawn its results."
  (with-timeout (60 (error "The search did not finish"))
    (while (buffer-local-value 'magent-store-search--process buffer)
      (accept-process-output nil 0.05))))

(defun magent-store-search-test--ids (buffer)
  "Return the session ids listed in BUFFER, top to bottom."
  (with-current-buffer buffer
    (mapcar (lambda (entry) (alist-get 'id (car entry))) tabulated-list-entries)))

(ert-deftest magent-store-search-lists-streamed-sessions-without-waiting ()
  "A search returns at once, then lists the sessions holding the words."
  (magent-store-test--with-backend
    (magent-store-search-test--write "s-flux" '("the flux capa" "citor hums, 漢字も"))
    (magent-store-search-test--write "s-other" '("nothing about that"))
    (let ((buffer (magent-store-search "flux capacitor")))
      ;; Asynchronous: the search runs in its own process.
      (should (process-live-p (buffer-local-value 'magent-store-search--process buffer)))
      (magent-store-search-test--wait buffer)
      (should (equal (magent-store-search-test--ids buffer) '("s-flux")))
      (with-current-buffer buffer
        ;; Both words are highlighted in the excerpt, and nothing else.
        (let (marked)
          (dotimes (i (1- (point-max)))
            (when (memq 'magent-store-search-match
                        (ensure-list (get-text-property (1+ i) 'face)))
              (push (char-after (1+ i)) marked)))
          (should (equal (concat (nreverse marked)) "fluxcapacitor")))
        (should (string-match-p "1 session" mode-line-process))))))

(defun magent-store-search-test--write-schema6 (session-id text)
  "Write SESSION-ID as magent itself writes it (schema 6), its reply TEXT."
  (let ((file (expand-file-name (concat "global/" session-id ".json")
                                magent-store-root))
        (item `((id . "item-1") (turn-id . "turn-1") (type . "message")
                (status . "completed") (role . "assistant") (content . ,text)
                (created-at . 1.7e9) (updated-at . 1.7e9))))
    (make-directory (file-name-directory file) t)
    (with-temp-file file
      (insert (json-serialize
               `((id . ,session-id) (schema-version . 6) (scope . "global")
                 (title . "An old session") (agent-jobs . []) (approval-overrides . [])
                 (snapshot
                  (id . ,session-id) (session-id . ,session-id) (scope . "global")
                  (status . "idle") (created-at . 1.7e9) (updated-at . 1.7e9)
                  (turns . [((id . "turn-1") (thread-id . ,session-id)
                             (status . "completed") (queued-at . 1.7e9)
                             (items . [,item]))])
                  (snapshot-created-at . 1.7e9) (last-event-seq . 3))
                 (journal . [])))))
    file))

(ert-deftest magent-store-search-finds-sessions-in-magents-own-format ()
  "A session magent wrote itself (schema 6) is searched as it is, and
its line says which format it is in."
  (magent-store-test--with-backend
    (magent-store-search-test--write "s-new" '("the flux capacitor, new"))
    (let* ((file (magent-store-search-test--write-schema6
                  "s-old" "the flux capacitor of old"))
           (before (with-temp-buffer (insert-file-contents-literally file)
                                     (buffer-string)))
           (buffer (magent-store-search "flux capacitor")))
      (magent-store-search-test--wait buffer)
      (should (equal (sort (magent-store-search-test--ids buffer) #'string<)
                     '("s-new" "s-old")))
      (with-current-buffer buffer
        (should (string-match-p "2 sessions" mode-line-process))
        (should-not (string-match-p "cannot be read" mode-line-process))
        (goto-char (point-min))
        (should (re-search-forward "^ An old session +global (schema 6)" nil t))
        ;; RET shows its transcript (`show' says on stderr which format it read).
        (let* ((magent-store-search-resume-functions nil)
               (view (call-interactively (key-binding (kbd "RET")))))
          (with-timeout (60 (error "The transcript did not appear"))
            (while (with-current-buffer view (string-prefix-p "Reading" (buffer-string)))
              (accept-process-output nil 0.05)))
          (should (string-match-p "the flux capacitor of old"
                                  (with-current-buffer view (buffer-string))))))
      (should (equal (with-temp-buffer (insert-file-contents-literally file)
                                       (buffer-string))
                     before)))))

(ert-deftest magent-store-search-keys-move-rerun-and-open ()
  "n and p move between sessions, g searches again, RET shows the transcript."
  (magent-store-test--with-backend
    (magent-store-search-test--write "s-one" '("a shared needle, first"))
    (magent-store-search-test--write "s-two" '("a shared needle, second"))
    (let ((buffer (magent-store-search "shared needle")))
      (magent-store-search-test--wait buffer)
      (with-current-buffer buffer
        (should (equal (sort (magent-store-search-test--ids buffer) #'string<)
                       '("s-one" "s-two")))
        (goto-char (point-min))
        (let ((first (alist-get 'id (tabulated-list-get-id))))
          (call-interactively (key-binding "n"))
          (should-not (equal (alist-get 'id (tabulated-list-get-id)) first))
          (call-interactively (key-binding "p"))
          (should (equal (alist-get 'id (tabulated-list-get-id)) first)))
        ;; g: a new process, the same answer (now including a new session).
        (magent-store-search-test--write "s-three" '("one more shared needle"))
        (call-interactively (key-binding "g"))
        (should (buffer-local-value 'magent-store-search--process buffer)))
      (magent-store-search-test--wait buffer)
      (should (= (length (magent-store-search-test--ids buffer)) 3))
      (with-current-buffer buffer
        (goto-char (point-min))
        (let* ((id (alist-get 'id (tabulated-list-get-id)))
               (view (call-interactively (key-binding (kbd "RET")))))
          (should (bufferp view))
          (with-timeout (60 (error "The transcript did not appear"))
            (while (with-current-buffer view
                     (string-prefix-p "Reading" (buffer-string)))
              (accept-process-output nil 0.05)))
          (with-current-buffer view
            (should buffer-read-only)
            (should (string-match-p (regexp-quote id) (buffer-string)))
            (should (looking-at-p "shared needle"))))))))

(ert-deftest magent-store-search-bad-query-is-explained-not-signalled ()
  "An unbalanced quote is reported in the results buffer; nothing breaks."
  (magent-store-test--with-backend
    (magent-store-search-test--write "s-q" '("some text"))
    (let ((buffer (magent-store-search "\"open quote")))
      (magent-store-search-test--wait buffer)
      (should (null (magent-store-search-test--ids buffer)))
      (with-current-buffer buffer
        (should (string-match-p "unbalanced double quote" mode-line-process))
        (should-not (string-match-p "sqlite\\|Traceback" mode-line-process))))
    (should-error (magent-store-search "  ") :type 'user-error)))

(ert-deftest magent-store-search-a-failed-search-says-why-once ()
  "A search that fails says why once in the echo area; one that succeeds
says nothing there."
  (magent-store-test--with-backend
    (magent-store-search-test--write "s-q" '("some text"))
    (let ((messages nil))
      (cl-letf (((symbol-function 'message)
                 (lambda (format &rest args)
                   (when format (push (apply #'format-message format args) messages)))))
        (magent-store-search-test--wait (magent-store-search "\"open quote"))
        (should (equal (length (cl-remove-if-not
                                (lambda (m) (string-match-p "\\`magent-store-search: .*unbalanced double quote" m))
                                messages))
                       1))
        (setq messages nil)
        (magent-store-search-test--wait (magent-store-search "some"))
        (should-not (cl-remove-if-not (lambda (m) (string-prefix-p "magent-store-search: " m))
                                      messages))))))

(ert-deftest magent-store-search-as-a-command-shows-its-list ()
  "Run as a command the search's list is shown; from Lisp it is only returned."
  (magent-store-test--with-backend
    (magent-store-search-test--write "s-one" '("a needle"))
    (save-window-excursion
      (let ((buffer (magent-store-search "needle")))
        (should-not (get-buffer-window buffer))
        (magent-store-search-test--wait buffer)
        (kill-buffer buffer)))
    (save-window-excursion
      (let ((buffer (funcall-interactively #'magent-store-search "needle")))
        (should (eq (window-buffer (selected-window)) buffer))
        (magent-store-search-test--wait buffer)
        (kill-buffer buffer)))))

(ert-deftest magent-store-search-a-transcript-starts-with-the-sessions-title ()
  "The transcript a hit opens starts with the session's title."
  (magent-store-test--with-backend
    (magent-store-search-test--write "s-titled" '("a needle"))
    (magent-store-put-header "s-titled" '((title . "Needle hunt")))
    (magent-store-flush "s-titled")
    (let ((buffer (magent-store-search "needle")))
      (magent-store-search-test--wait buffer)
      (with-current-buffer buffer
        (goto-char (point-min))
        (let ((view (magent-store-search-open)))
          (with-timeout (60 (error "The transcript did not appear"))
            (while (with-current-buffer view
                     (string-prefix-p "Reading" (buffer-string)))
              (accept-process-output nil 0.05)))
          (with-current-buffer view
            (should (string-prefix-p "Needle hunt\nglobal  s-titled\n" (buffer-string)))))))))

(ert-deftest magent-store-search-highlights-matches-at-either-end ()
  "A match at the very start or end of an excerpt is highlighted; spans that
do not fit the text are left out, without an error."
  (let ((text (magent-store-search--highlight
               '((text . "needle in a needle") (highlights (0 6) (12 18) (nil 3) (5 99))))))
    (should (equal text "needle in a needle"))
    (dolist (at '(0 5 12 17))
      (should (memq 'magent-store-search-match (ensure-list (get-text-property at 'face text)))))
    (dolist (at '(6 11))
      (should-not (get-text-property at 'face text)))))

(ert-deftest magent-store-search-tool-output-only-when-asked ()
  "Tool output is searched only with `magent-store-search-include-tools'."
  (magent-store-test--with-backend
    (magent-store-open "s-tool")
    (magent-store-test--start-turn "s-tool")
    (magent-store-append-event
     "s-tool" (magent-store-test--event
               "item-started" :turn-id "turn-1" :item-id "tool-1"
               :payload `((item . ,(magent-store-test--item "tool-1" "turn-1" nil "tool")))))
    (magent-store-append-item-content "s-tool" "tool-1" "grep found ZORBLAX_42 here" t)
    (magent-store-flush "s-tool")
    (let ((buffer (magent-store-search "zorblax_42")))
      (magent-store-search-test--wait buffer)
      (should (null (magent-store-search-test--ids buffer))))
    (let* ((magent-store-search-include-tools t)
           (buffer (magent-store-search "zorblax_42")))
      (magent-store-search-test--wait buffer)
      (should (equal (magent-store-search-test--ids buffer) '("s-tool"))))))

(ert-deftest magent-store-search-ret-offers-the-session-to-resume-functions ()
  "RET hands the session's header file to the resume functions first; the
first that returns non-nil has opened it, else the transcript is shown."
  (magent-store-test--with-backend
    (magent-store-search-test--write "s-resume" '("resume me please"))
    (let ((buffer (magent-store-search "resume me"))
          (offered nil))
      (magent-store-search-test--wait buffer)
      (let ((magent-store-search-resume-functions
             (list (lambda (file hit) (push (list 'declined file (alist-get 'id hit)) offered)
                     nil)
                   (lambda (file _hit) (push (list 'taken file) offered) 'resumed)
                   (lambda (file _hit) (push (list 'never-asked file) offered) t))))
        (with-current-buffer buffer
          (goto-char (point-min))
          (should (eq (call-interactively (key-binding (kbd "RET"))) 'resumed))))
      (let ((header (expand-file-name "global/s-resume.json" magent-store-root)))
        (should (file-exists-p header))
        (should (equal (reverse offered)
                       `((declined ,header "s-resume") (taken ,header)))))
      ;; Nobody takes it: the read-only transcript.
      (let ((magent-store-search-resume-functions (list (lambda (_file _hit) nil))))
        (with-current-buffer buffer
          (goto-char (point-min))
          (let ((view (call-interactively (key-binding (kbd "RET")))))
            (should (bufferp view))
            (should (string-prefix-p "*magent-store session s-resume" (buffer-name view)))
            (with-timeout (60 (error "The transcript did not appear"))
              (while (with-current-buffer view
                       (string-prefix-p "Reading" (buffer-string)))
                (accept-process-output nil 0.05)))
            (should (string-match-p "resume me please"
                                    (with-current-buffer view (buffer-string))))))))))

(ert-deftest magent-store-search-a-prompt-held-by-the-turns-input-is-found-and-shown ()
  "A turn whose prompt is its input alone (no user message) is found by
its words, and its transcript shows the prompt, whole, before the reply."
  (magent-store-test--with-backend
    ;; The test turns' input is "Say something", and they have no user message.
    (magent-store-search-test--write "s-asked" '("the answer\n* not a heading"))
    (let ((buffer (magent-store-search "something")))
      (magent-store-search-test--wait buffer)
      (ert-info ((buffer-local-value 'mode-line-process buffer) :prefix "Search: ")
        (should (equal (magent-store-search-test--ids buffer) '("s-asked"))))
      (kill-buffer buffer))
    (let ((view (magent-store-search-view
                 `((id . "s-asked") (title . "Asked") (scope-label . "global")
                   (header . ,(expand-file-name "global/s-asked.json" magent-store-root))))))
      (with-timeout (60 (error "The session was not shown"))
        (while (with-current-buffer view (string-prefix-p "Reading" (buffer-string)))
          (accept-process-output nil 0.05)))
      (with-current-buffer view
        (should (string-match-p
                 "── user ──\nSay something\n\n── assistant ──\nthe answer\n\\* not a heading"
                 (buffer-string))))
      (kill-buffer view))))

(provide 'magent-store-search-tests)
;;; magent-store-search-tests.el ends here
